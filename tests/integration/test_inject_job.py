"""``perfmon inject --job NAME`` / ``detach --job NAME``: a bare job found by its name on this node,
and on every node of a job through the transport (``--hosts`` ... ``--via``).

The "nodes" are PID namespaces on this machine (``unshare``): a command run "on" one through
tests/integration/scripts/node_standin.py sees only that node's processes, so ``perfmon inject
--job`` there finds and enters that node's rank only, as on a real node. The targets
(tests/integration/scripts/inject_target.py ``--until-told``) train until told to stop, know
nothing of perfmon, and check from inside at their end that nothing of perfmon is left in them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import perfmon, report_until
from tests.integration.streamutil import left_by_perfmon
from tui.stream import native

SCRIPTS = Path(__file__).parent / "scripts"
ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
TRAINING = ["--until-told", "--step-sleep", "0.005"]

from tui.injector import why_no_rights  # noqa: E402

# the default entry method: sys.remote_exec on Python 3.14+, else ptrace through hypno; either needs
# ptrace rights over the target
REMOTE_EXEC = sys.version_info >= (3, 14)
needs_ptrace = pytest.mark.skipif(why_no_rights() is not None, reason=f"no ptrace rights here: {why_no_rights()}")
pytestmark = pytest.mark.skipif(not REMOTE_EXEC and importlib.util.find_spec("hypno") is None,
                                reason="entering a process before Python 3.14 needs hypno "
                                       "(pip install 'perfmon[inject]')")


def _namespaces_work() -> bool:
    try:
        return subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True,
                              timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def stepping(ranks: int):
    """A report's condition: ``ranks`` ranks, each with steps."""
    return lambda report: len(report["ranks"]) == ranks and all(r["steps"] > 0 for r in report["ranks"])


def stacks(pid: int) -> str:
    """Where the job's threads are (py-spy), for a failure's message: what held the injected code up."""
    return native.dump(pid)


class Trainer:
    """inject_target.py training until ``stop()``; ``prefix`` runs it inside something (a namespace)."""

    def __init__(self, script: Path, *args: str, prefix: tuple[str, ...] = (), flags: tuple[str, ...] = (),
                 env: dict | None = None) -> None:
        self.proc = subprocess.Popen([*prefix, PY, *flags, str(script), *TRAINING, *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        self.ready = json.loads(self.proc.stdout.readline())
        self.pid = self.ready["ready"]          # its PID as it sees itself

    def stop(self) -> dict:
        out, _ = self.proc.communicate("stop\n", timeout=60)
        assert self.proc.returncode == 0
        return json.loads(out.splitlines()[-1])


@pytest.fixture
def job_name(tmp_path) -> str:
    """A job name no other process on the machine runs: inject_target.py copied under that name."""
    name = f"job{os.getpid()}x{tmp_path.name.rsplit('_', 1)[-1]}"
    shutil.copy(SCRIPTS / "inject_target.py", tmp_path / f"{name}.py")
    return name


@pytest.fixture
def trainers(tmp_path, job_name):
    started: list[Trainer] = []

    def start(*args: str, **kwargs) -> Trainer:
        started.append(Trainer(tmp_path / f"{job_name}.py", *args, **kwargs))
        return started[-1]
    yield start
    for trainer in started:
        trainer.proc.kill()
        trainer.proc.wait()


@needs_ptrace
def test_a_job_name_finds_the_trainer_not_its_loader_workers_and_two_jobs_by_one_name_are_refused(trainers, job_name):
    trainer = trainers("--workers", "2")          # its DataLoader workers run the same command line
    other = trainers()                         # an unrelated run of the same script
    refused = perfmon("inject", "--job", job_name)
    assert refused.returncode == 2
    assert refused.stderr == (f"perfmon inject: 2 jobs named {job_name} run on this node (processes "
                              f"{min(trainer.pid, other.pid)}; {max(trainer.pid, other.pid)}): give the PID of one "
                              "(or its torchrun launcher's)\n")
    assert left_by_perfmon(other.stop()) == {}       # refused before any process was entered
    inject = perfmon("inject", "--job", job_name, "--timeout", "30")
    assert inject.returncode == 0, inject.stderr
    assert [line.split(" (")[0] for line in inject.stdout.splitlines() if line.startswith("injected")] == [
        f"injected {trainer.pid}: job {job_name} rank 0"]
    report = report_until(stepping(1), job_name)
    assert [r["pid"] for r in report["ranks"]] == [trainer.pid]
    detach = perfmon("detach", "--job", job_name)
    assert detach.returncode == 0, detach.stderr
    assert detach.stdout == f"{trainer.pid}: detached\n"
    assert left_by_perfmon(trainer.stop()) == {}


@pytest.fixture
def bare_environment(tmp_path) -> dict:
    """The environment of a job that has torch and nothing of perfmon's: this one's site-packages
    less perfmon, hypno and the modules perfmon's probe imports (links in a directory of their own,
    on PYTHONPATH of a ``python -S``, which reads no site-packages or .pth file)."""
    import torch
    site = Path(torch.__file__).resolve().parents[1]
    bare = tmp_path / "site-packages"
    bare.mkdir()
    left_out = ("probe", "tui", "perfmon", "msgpack", "psutil", "pynvml", "nvidia_ml_py", "hypno", "pyinjector",
                "__editable__")
    for entry in site.iterdir():
        if not entry.name.lower().startswith(left_out) and entry.suffix != ".pth":
            (bare / entry.name).symlink_to(entry)
    return {**os.environ, "PYTHONPATH": str(bare)}


@needs_ptrace
def test_a_job_without_perfmon_in_its_environment_gets_the_probe_and_its_dependencies_from_perfmons(
        bare_environment, trainers, job_name):
    trainer = trainers(flags=("-S",), env=bare_environment)
    assert trainer.ready["importable"] == []
    inject = perfmon("inject", str(trainer.pid), "--timeout", "30")
    assert inject.returncode == 0, f"{inject.stderr}\n{stacks(trainer.proc.pid)}"
    report_until(stepping(1), str(trainer.pid))
    detach = perfmon("detach", str(trainer.pid))
    assert detach.returncode == 0, f"{detach.stderr}\n{stacks(trainer.proc.pid)}"
    end = trainer.stop()
    assert left_by_perfmon(end) == {}
    modules = end["residue"]["modules"]
    assert set(modules["after"]) - set(modules["before"]) >= {"pynvml"}     # NVML's came with the probe, and stays


@pytest.fixture
def nodes(tmp_path_factory, trainers):
    """Two "nodes" n01 and n02, each a PID namespace running rank r of the bare job: the environment
    and transport that reach them, and the ranks."""
    tmp_path = tmp_path_factory.mktemp("nodes")     # short: the nodes' sockets are under it
    if not _namespaces_work():
        pytest.skip("unshare cannot make a PID namespace here (needs CAP_SYS_ADMIN)")
    ranks = []
    for rank, host in enumerate(("n01", "n02")):
        home = tmp_path / host
        home.mkdir(mode=0o700)
        env = {**os.environ, "PERFMON_DIR": str(home), "RANK": str(rank), "WORLD_SIZE": "2"}
        trainer = trainers(prefix=("unshare", "--pid", "--fork", "--mount-proc", "--kill-child"), env=env)
        assert trainer.pid == 1                          # the namespace's first process
        inside = Path(f"/proc/{trainer.proc.pid}/task/{trainer.proc.pid}/children").read_text().split()
        (home / "pid").write_text(inside[0])             # as this machine sees it, for nsenter
        ranks.append(trainer)
    env = {**os.environ, "PATH": f"{Path(PY).parent}{os.pathsep}{os.environ['PATH']}"}   # `perfmon` on each node
    env.pop("PERFMON_VIA", None)
    via = f"{PY} {SCRIPTS / 'node_standin.py'} {tmp_path} {{host}}"
    return env, via, ranks


@needs_ptrace
def test_one_inject_reaches_every_node_all_or_none_and_detach_leaves_nothing(nodes, job_name):
    env, via, trained = nodes
    everywhere = ("--hosts", "n[01-02]", "--via", via)
    # a node that cannot be reached: the node already entered is undone, one line says so
    half = perfmon("inject", "--job", job_name, "--hosts", "n01,down", "--via", via, "--timeout", "30", env=env)
    assert half.returncode == 2
    assert half.stderr == ("perfmon inject: down: ssh: connect to host down port 22: Connection refused; "
                           "undone on n01\n")
    assert half.stdout == ""
    gone = perfmon("detach", "--job", job_name, "--hosts", "n01", "--via", via, env=env)
    assert gone.returncode == 2
    assert gone.stderr == "perfmon detach: n01: 1: no probe injected by perfmon in this process\n"

    inject = perfmon("inject", "--job", job_name, *everywhere, "--timeout", "30", env=env)
    assert inject.returncode == 0, inject.stderr
    injected = sorted(line.split(" (")[0] for line in inject.stdout.splitlines() if ": injected" in line)
    assert injected == [f"n01: injected 1: job {job_name} rank 0", f"n02: injected 1: job {job_name} rank 1"]
    assert f"perfmon detach --job {job_name} --hosts n[01-02]" in inject.stdout

    ranks = report_until(stepping(2), job_name, *everywhere, env=env)["ranks"]
    assert sorted((r["rank"], r["host"]) for r in ranks) == [(0, "n01"), (1, "n02")]

    detach = perfmon("detach", "--job", job_name, *everywhere, env=env)
    assert detach.returncode == 0, detach.stderr
    assert sorted(detach.stdout.splitlines()) == ["n01: 1: detached", "n02: 1: detached"]
    for trainer in trained:
        assert left_by_perfmon(trainer.stop()) == {}


@needs_ptrace
def test_a_probe_entered_after_the_steps_forward_still_finds_the_model(tmp_path):
    """Entered between backward and the optimizer's step, the probe starts at that step's end having
    seen no forward: the model it hooks is the root of the forwards that follow."""
    in_python = ["--pause-in-python"] if REMOTE_EXEC else []     # sys.remote_exec enters a thread running Python
    job = subprocess.Popen([PY, str(SCRIPTS / "inject_target.py"), "--steps", "300", "--pause-at", "50,150",
                            "--pause-after-backward", *in_python], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           text=True)
    try:
        assert json.loads(job.stdout.readline())["pause"] == 50
        inject = subprocess.Popen([PY, "-m", "tui.cli", "inject", str(job.pid), "--timeout", "30"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert "dormant hooks installed" in inject.stderr.readline()
        job.stdin.write("go\n")
        job.stdin.flush()
        assert inject.wait(timeout=60) == 0, inject.stderr.read()
        assert json.loads(job.stdout.readline())["pause"] == 150
        recorded = perfmon("record", str(job.pid), "-o", str(tmp_path / "rec"), "--seconds", "0.5")
        assert recorded.returncode == 0, recorded.stderr
        assert perfmon("detach", str(job.pid)).returncode == 0
        job.communicate("go\n", timeout=60)
        assert job.returncode == 0
    finally:
        job.kill()
    from probe.recording import read_recording, recording_files
    records = [r for f in recording_files(tmp_path / "rec") for r in read_recording(f).records]
    steps = [r for r in records if r["k"] == "step"]
    assert len(steps) >= 90                                    # steps 51..149, the ring's backfill
    assert all(r["phases"].get("forward", 0) > 0 for r in steps[1:]), \
        [(i, r["step"], r["phases"]) for i, r in enumerate(steps) if "forward" not in r["phases"]]
    assert not [r for r in records if r["k"] == "event" and "not visible" in r.get("message", "")]


@needs_ptrace
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed")
def test_inject_attach_across_nodes_shows_every_rank_and_leaving_it_detaches_everywhere(nodes, job_name, tmp_path):
    from tests.e2e.test_tmux import PANE_TITLES, Tmux, wait_screen

    env, via, trained = nodes
    status = tmp_path / "status"
    tmux = Tmux(tmp_path / "tmux.sock")
    try:
        tmux.start(f"env PATH={env['PATH']} TERM=xterm-256color {PY} -m tui.cli inject --job {job_name} "
                   f"--hosts n01,n02 --via '{via}' --attach; echo $? > {status}", 120, 36)
        screen = wait_screen(tmux, lambda s: "2/2 ranks" in s and all(t in s for t in PANE_TITLES), timeout=60)
        assert job_name in screen and "Traceback" not in screen
        tmux.run("send-keys", "-t", "t", "q")
        wait_screen(tmux, lambda s: f"detach perfmon from job {job_name} on 2 hosts? [Y/n]" in s, timeout=15)
        tmux.run("send-keys", "-t", "t", "Enter")
        wait_screen(tmux, lambda s: status.exists() and status.read_text().strip() != "", timeout=30)
        assert status.read_text().strip() == "0", tmux.screen()
        screen = tmux.screen()
        assert "n01: 1: detached" in screen and "n02: 1: detached" in screen
    finally:
        tmux.kill()
    for trainer in trained:                      # the ranks went on, and nothing of perfmon is left in them
        assert trainer.proc.poll() is None
        assert left_by_perfmon(trainer.stop()) == {}


@needs_ptrace
def test_an_injected_probe_reads_the_jobs_nvml_and_leaves_it_initialised_as_it_found_it(trainers):
    """A SIMULATED pynvml (tests/sim) is the job's own, initialised once by the job: the probe finds it
    as a user's job would (``import pynvml``), reads the GPU through it, and its detach undoes only
    its own ``nvmlInit``."""
    trainer = trainers("--simulated-nvml", env={**os.environ, "PYTHONPATH": str(ROOT)})
    inject = perfmon("inject", str(trainer.pid), "--timeout", "30")
    assert inject.returncode == 0, inject.stderr
    report_until(stepping(1), str(trainer.pid))
    assert perfmon("detach", str(trainer.pid)).returncode == 0
    end = trainer.stop()
    assert end["nvml"]["calls"] > 0              # the probe read the simulated GPU
    assert end["nvml"]["initialized"] == 1       # the job's own init; the probe's was undone
    assert left_by_perfmon(end) == {}
