"""``perfmon inject`` / ``detach``: the probe started in a job that runs without perfmon, then removed.

The targets (tests/integration/scripts/inject_*.py) know nothing of perfmon; the one-process
target pauses at given steps (reading stdin), so injection, report and detach happen at known
steps, and it checks from inside, at its end, that nothing of perfmon is left in it. The scenarios
run for each entry method: ptrace (hypno) and ``sys.remote_exec`` (Python 3.14+; on an older Python
those cases skip: scripts/py314_check.sh runs them under a real 3.14).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import perfmon
from tests.integration.streamutil import kill_tree, left_by_perfmon, wait_for

SCRIPTS = Path(__file__).parent / "scripts"
PY = sys.executable
TARGET = [PY, str(SCRIPTS / "inject_target.py")]

from tui.injector import why_no_rights  # noqa: E402

# entering a process needs ptrace rights over it, by either method (sys.remote_exec writes its memory
# under the same rule); without them (a user under Ubuntu's default ptrace_scope 1) every inject is
# refused before anything else is looked at, as a unit test shows
needs_ptrace = pytest.mark.skipif(why_no_rights() is not None, reason=f"no ptrace rights here: {why_no_rights()}")
HAS_HYPNO = importlib.util.find_spec("hypno") is not None
HAS_REMOTE_EXEC = sys.version_info >= (3, 14)
needs_remote_exec = pytest.mark.skipif(not HAS_REMOTE_EXEC, reason=(
    f"sys.remote_exec (PEP 768) needs Python 3.14; this is {sys.version_info[0]}.{sys.version_info[1]} "
    "(scripts/py314_check.sh runs these under 3.14)"))
METHODS = [
    pytest.param("ptrace", marks=[needs_ptrace, pytest.mark.skipif(
        not HAS_HYPNO, reason="the ptrace method needs hypno (pip install 'perfmon[inject]')")]),
    pytest.param("remote-exec", marks=[needs_ptrace, needs_remote_exec]),
]


class Paused:
    """inject_target.py, paused at each of its ``--pause-at`` steps until ``go()``. For ``method``
    remote-exec its main thread runs Python while paused (sys.remote_exec enters there only)."""

    def __init__(self, *args: str, method: str = "ptrace", **popen) -> None:
        extra = ["--pause-in-python"] if method == "remote-exec" else []
        self.proc = subprocess.Popen([*TARGET, *args, *extra], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, **popen)
        self.pid = self.proc.pid
        self.err = ""

    def wait_pause(self) -> int:
        return json.loads(self.proc.stdout.readline())["pause"]

    def go(self) -> None:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def finish(self) -> dict:
        out, self.err = self.proc.communicate(timeout=60)
        assert self.proc.returncode == 0
        return json.loads(out.splitlines()[-1])


def _maps(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.parametrize("method", METHODS)
def test_inject_report_detach_leaves_the_loss_bit_identical_and_nothing_behind(method):
    bare = subprocess.run([*TARGET, "--steps", "400"], capture_output=True, text=True, timeout=60)
    bare_loss = json.loads(bare.stdout.splitlines()[-1])["loss"]
    job = Paused("--steps", "400", "--pause-at", "100,300", method=method)
    try:
        assert job.wait_pause() == 100
        inject = subprocess.Popen([PY, "-m", "tui.cli", "inject", str(job.pid), "--timeout", "30", "--method", method],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert "dormant hooks installed" in inject.stderr.readline()
        job.go()        # the probe's socket comes up at the first optimizer step after the injection
        out, err = inject.communicate(timeout=60)
        assert inject.returncode == 0, err
        assert f"injected {job.pid}" in out
        assert job.wait_pause() == 300
        report = perfmon("report", str(job.pid), "--json", "--seconds", "1")
        assert report.returncode == 0, report.stderr
        rep = json.loads(report.stdout)
        assert rep["verdict"]["bottleneck"]
        assert abs(rep["ranks"][0]["steps"] - 200) <= 1      # steps 101..300: those since the injection
        detach = perfmon("detach", str(job.pid))
        assert detach.returncode == 0, detach.stderr
        assert f"{job.pid}: detached" in detach.stdout
        job.go()
        end = job.finish()
    finally:
        job.proc.kill()
    assert end["loss"] == bare_loss
    assert left_by_perfmon(end) == {}


@pytest.mark.parametrize("method", METHODS)
def test_detach_without_injection_and_second_inject_are_refused(method):
    job = Paused("--steps", "200", "--pause-at", "50,100", method=method)
    try:
        assert job.wait_pause() == 50
        refused = perfmon("detach", str(job.pid), "--method", method)
        assert refused.returncode == 2
        assert refused.stderr.strip() == f"perfmon detach: {job.pid}: no probe injected by perfmon in this process"
        inject = subprocess.Popen([PY, "-m", "tui.cli", "inject", str(job.pid), "--timeout", "30", "--method", method],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert "dormant hooks installed" in inject.stderr.readline()
        job.go()
        assert inject.wait(timeout=60) == 0, inject.stderr.read()
        assert job.wait_pause() == 100
        again = perfmon("inject", str(job.pid), "--method", method)
        assert again.returncode == 2
        assert "already" in again.stderr and len(again.stderr.strip().splitlines()) == 1
        assert perfmon("detach", str(job.pid)).returncode == 0
        job.go()
        assert job.finish()["steps"] == 200
    finally:
        job.proc.kill()


def _refused(pid: int, expected: str, *prefix: str) -> None:
    out = subprocess.run([*prefix, PY, "-m", "tui.cli", "inject", str(pid)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("perfmon inject: ") and expected in lines[0], out.stderr


@pytest.mark.skipif(not HAS_HYPNO, reason="hypno's library is what runs the statement inside dlopen")
def test_the_statement_run_inside_dlopen_lets_the_loader_go_before_its_thread_loads_anything(tmp_path):
    """Entered through ptrace, the injected statement runs inside ``dlopen`` (hypno's library
    constructor), holding the dynamic loader's lock, and starts perfmon-inject, which imports C
    extensions: each import holds the GIL while it waits for that lock, and the entering thread
    needs the GIL back to return. Planted without ptrace: the target loads hypno's library with the
    statement in it itself, its thread slowed on the way out of the statement (as a loaded machine or
    ptrace slows it: a profile hook sleeps at each return there), so that the started thread reaches
    its first C extension first; that thread must wait until the entering thread has left."""
    from hypno.api import INJECTION_LIB_PATH, MAGIC

    from probe.inject import payload
    from tui.injector import _paths

    result = tmp_path / "answer.json"
    lib = INJECTION_LIB_PATH.read_bytes()
    at = lib.find(MAGIC) - 1
    code = payload("inject", _paths(), str(result)).encode()
    (tmp_path / "entry.so").write_bytes(lib[:at] + code + b"\0" + lib[at + len(code) + 1:])
    target = ("import ctypes, os, sys, time, torch\n"
              "def slowly(frame, event, arg):\n"
              "    if event == 'return' and frame.f_globals.get('__name__') in ('threading', '__perfmon_inject__'):\n"
              "        time.sleep(0.1)\n"
              "sys.setprofile(slowly)\n"
              "ctypes.CDLL(sys.argv[1])\n"
              "sys.setprofile(None)\n"
              "while not os.path.exists(sys.argv[2]):\n"
              "    time.sleep(0.01)\n")
    proc = subprocess.Popen([PY, "-c", target, str(tmp_path / "entry.so"), str(result)], stderr=subprocess.PIPE,
                            text=True)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("the target never came out of dlopen: the loader-lock deadlock") from None
    assert proc.returncode == 0, err
    assert json.loads(result.read_text())["ok"] is True


@pytest.fixture
def sleeper():
    started: list[subprocess.Popen] = []

    def start(*cmd: str) -> subprocess.Popen:
        proc = subprocess.Popen(list(cmd), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        started.append(proc)
        return proc
    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def _untouched(pid: int) -> None:
    assert "hypno" not in _maps(pid)


@needs_ptrace
def test_refusals_leave_the_target_untouched(sleeper):
    gone = subprocess.run([PY, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    _refused(int(gone.stdout), "no process")

    not_python = sleeper("sleep", "60")
    _refused(not_python.pid, "is not a Python process")
    _untouched(not_python.pid)

    no_torch = sleeper(PY, "-c", "import sys; print('up', flush=True); sys.stdin.read()")
    no_torch.stdout.readline()
    _refused(no_torch.pid, "has not loaded torch")
    _untouched(no_torch.pid)


def _other_pythons() -> list[str]:
    """CPython executables of another minor version: on PATH, or installed beside this one (pyenv)."""
    minor = sys.version_info[1]
    names = [f"python3.{m}" for m in range(8, 16) if m != minor]
    found = [exe for exe in map(shutil.which, names) if exe]
    for name in names:
        found += sorted(str(p) for p in Path(sys.base_prefix).parent.glob(f"3.*/bin/{name}"))
    return found


@needs_ptrace
def test_a_python_version_mismatch_is_refused(sleeper):
    other = next((exe for exe in _other_pythons()
                  if subprocess.run([exe, "-c", ""], capture_output=True).returncode == 0), None)
    if other is None:
        pytest.skip("no other CPython minor version on this machine")
    proc = sleeper(other, "-c", "import sys; print(sys.version_info[1], flush=True); sys.stdin.read()")
    minor = int(proc.stdout.readline())
    _refused(proc.pid, f"runs Python 3.{minor}, this perfmon runs 3.{sys.version_info[1]}")
    _untouched(proc.pid)


def test_no_ptrace_rights_over_another_users_process_is_refused(sleeper):
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to start a process as another user")
    other_user = sleeper("setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "sleep", "60")
    wait_for(lambda: Path(f"/proc/{other_user.pid}/status").read_text().count("65534") >= 2, what="uid switch")
    # perfmon without CAP_SYS_PTRACE: the process of another uid is out of its reach
    _refused(other_user.pid, "no ptrace rights", "setpriv", "--bounding-set", "-sys_ptrace", "--inh-caps",
             "-sys_ptrace")


def test_ptrace_denied_by_the_kernel_is_refused(sleeper):
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to drop CAP_SYS_PTRACE")
    # same user, but not dumpable: the kernel lets only CAP_SYS_PTRACE trace it or read its memory map
    denied = sleeper(PY, "-c", "import ctypes, sys, torch; ctypes.CDLL(None).prctl(4, 0); print('up', flush=True); "
                               "sys.stdin.read()")
    assert denied.stdout.readline().strip() == "up"
    _refused(denied.pid, "no ptrace rights", "setpriv", "--bounding-set", "-sys_ptrace", "--inh-caps", "-sys_ptrace")
    _untouched(denied.pid)


def _rank_stacks(launcher: subprocess.Popen) -> str:
    """Where each rank's threads are (py-spy), for a failure's message: what held the job up."""
    import psutil

    from tui.stream import native
    return "".join(f"\nrank process {p.pid}:\n{native.dump(p.pid)}" for p in psutil.Process(launcher.pid).children())


@pytest.mark.parametrize("method", METHODS)
def test_a_torchrun_launcher_pid_injects_every_rank(tmp_path, method):
    ready = tmp_path / "ready"
    ready.mkdir()
    log = tmp_path / "job.log"      # the ranks' own words (a probe's problem is said there), read on failure
    with log.open("w") as out:
        launcher = subprocess.Popen([PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                                     str(SCRIPTS / "inject_ddp.py"), "--ready", str(ready)],
                                    stdout=out, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: len(list(ready.glob("[0-9]"))) == 2, timeout=60, what="both ranks training")
        inject = perfmon("inject", str(launcher.pid), "--timeout", "30", "--method", method)
        assert inject.returncode == 0, inject.stderr + _rank_stacks(launcher) + log.read_text()[-3000:]
        lines = [line for line in inject.stdout.splitlines() if line.startswith("injected")]
        assert len(lines) == 2
        job = lines[0].split("job ")[1].split()[0]
        report = perfmon("report", job, "--json", "--seconds", "2")
        assert report.returncode == 0, report.stderr
        rep = json.loads(report.stdout)
        assert sorted(r["rank"] for r in rep["ranks"]) == [0, 1]
        # DDP's gradient all-reduce is not timed (below), the script's own all-reduce of a flag is: the
        # ranks' time off CPU is then not measured, never "host wait"; the reason comes from the DDP
        # module the probe found as the root of the forward (after the first step, when it entered
        # after that step's forward)
        verdict = rep["verdict"]
        assert verdict["bottleneck"] == "not_measured", verdict["headline"]
        assert "a probe started by perfmon inject" in verdict["evidence"]["skipped"]["comm_exposed"]
        assert "communication is not timed in this 2-rank job" in verdict["headline"]
        detach = perfmon("detach", str(launcher.pid))
        assert detach.returncode == 0, detach.stderr
        assert detach.stdout.count("detached") == 2
        launcher.send_signal(signal.SIGTERM)
        launcher.wait(timeout=60)
    finally:
        kill_tree(launcher)         # its ranks too, should they hang
    ends = [json.loads(path.read_text()) for path in sorted(ready.glob("end-*.json"))]
    assert sorted(end["rank"] for end in ends) == [0, 1], log.read_text()[-2000:]
    for end in ends:        # DDP's comm hook cannot be removed: an injected probe never registers one
        assert end["ddp_attrs"] == [] and end["comm_hooks"] == 0
        assert not [name for name in end["threads"] if name.startswith("perfmon")]


@needs_ptrace
@needs_remote_exec
def test_a_main_thread_that_never_reaches_a_safe_point_is_refused_and_nothing_runs_later(tmp_path):
    """The main thread blocked in ``read`` past the timeout: perfmon withdraws, and when the thread
    does run the entry file later, it finds the marker gone, removes its directory, starts nothing."""
    job = Paused("--steps", "200", "--pause-at", "50,100", stderr=subprocess.PIPE)     # blocks in read
    try:
        assert job.wait_pause() == 50
        env = {**os.environ, "TMPDIR": str(tmp_path)}
        refused = perfmon("inject", str(job.pid), "--method", "remote-exec", "--timeout", "1", env=env)
        assert refused.returncode == 2
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1 and f"the main thread of {job.pid} did not reach" in lines[0], refused.stderr
        assert "nothing of it ran there, and nothing will" in lines[0]
        [left] = tmp_path.glob("perfmon-inject-*")          # the entry file waits for the main thread
        assert sorted(p.name for p in left.iterdir()) == ["entry.py"]
        job.go()            # the main thread runs Python again: it runs the entry file, which does nothing
        wait_for(lambda: not left.exists(), timeout=30, what="the withdrawn entry file removing its directory")
        assert job.wait_pause() == 100      # 50 steps later: an injected probe would serve its socket by now
        report = perfmon("report", str(job.pid), "--json")
        assert report.returncode == 2 and f"process {job.pid} has no perfmon probe" in report.stderr
        job.go()
        end = job.finish()
    finally:
        job.proc.kill()
    assert end["steps"] == 200 and left_by_perfmon(end) == {}
    assert "debugger script" not in job.err and "Traceback" not in job.err, job.err


@needs_ptrace
@needs_remote_exec
@pytest.mark.parametrize("how, why", [
    ({"PYTHON_DISABLE_REMOTE_DEBUG": "1"}, "its environment sets PYTHON_DISABLE_REMOTE_DEBUG"),
    ({"PYTHON_DISABLE_REMOTE_DEBUG": ""}, "its environment sets PYTHON_DISABLE_REMOTE_DEBUG"),
    ("-Xdisable-remote-debug", "it was started with -X disable-remote-debug"),
])
def test_remote_exec_is_refused_where_the_target_turned_remote_debugging_off(how, why):
    env = {**os.environ, **how} if isinstance(how, dict) else None
    options = [how] if isinstance(how, str) else []
    proc = subprocess.Popen([PY, *options, "-c", "import sys, torch; print(sys.is_remote_debug_enabled(), "
                             "flush=True); sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "False"        # CPython agrees: remote debugging is off in it
        out = perfmon("inject", str(proc.pid), "--method", "remote-exec")
        assert out.returncode == 2
        assert out.stderr.strip() == (f"perfmon inject: --method remote-exec cannot enter {proc.pid}: remote "
                                      f"debugging is off in {proc.pid}: {why}; --method ptrace enters it through "
                                      "ptrace (docs/attach.md)")
        if not HAS_HYPNO:   # auto goes to ptrace, which needs hypno: the refusal says both
            auto = perfmon("inject", str(proc.pid))
            assert auto.returncode == 2 and "through ptrace needs hypno" in auto.stderr and why in auto.stderr
    finally:
        proc.kill()
        proc.wait()
