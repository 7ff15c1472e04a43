"""``perfmon inject`` / ``detach`` without entering any process: the checks that refuse from
/proc alone, the code the target runs (here, in this process), and ``perfmon attach`` on a
process with no probe. The injections themselves: tests/integration/test_inject.py."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import threading
from pathlib import Path

import pytest
import torch  # noqa: F401  (this process must have loaded torch for check() to accept it)

from probe import inject as target_side
from tests.integration.streamutil import wait_for
from tui import injector, processes
from tui.commands.inject import fanout
from tui.errors import UserError
from tui.stream import discovery


@pytest.mark.parametrize("exe, maps, version", [
    ("/usr/bin/python3.12", "", (3, 12)),
    ("/opt/py/bin/python3.10d", "", (3, 10)),
    ("/usr/bin/python3", "7f00 r-xp /usr/lib/libpython3.13.so.1.0\n", (3, 13)),
    ("/usr/bin/sleep", "7f00 r-xp /usr/lib/libc.so.6\n", None),
    ("/usr/bin/python3", "", None),
])
def test_python_version_from_libpython_or_the_executables_name(exe, maps, version):
    assert injector._python_version(exe, maps) == version


def test_a_pid_that_does_not_exist_is_refused():
    pid = 1 << 30      # above any pid_max Linux allows
    with pytest.raises(UserError, match=f"no process {pid}"):
        injector.check(pid)


def test_this_interpreter_passes_every_check():
    target = injector.check(os.getpid())
    assert target.pid == os.getpid() and os.path.realpath(target.exe) == os.path.realpath(f"/proc/{os.getpid()}/exe")


@pytest.mark.parametrize("scope, privileged, why", [
    (0, False, None), (1, False, "ptrace_scope is 1"), (2, False, "ptrace_scope is 2"),
    (1, True, None), (2, True, None), (3, True, "ptrace_scope is 3"),
])
def test_ptrace_rights_follow_yama_and_the_capability(monkeypatch, scope, privileged, why):
    monkeypatch.setattr(injector, "_ptrace_scope", lambda: scope)
    monkeypatch.setattr(injector, "_can_ptrace_any", lambda: privileged)
    got = injector.why_no_rights()
    assert got is None if why is None else why in got
    if why is not None:                              # refused from /proc alone, before anything else
        with pytest.raises(UserError, match=f"no ptrace rights over {os.getpid()}: .*{why}"):
            injector.check(os.getpid())


def test_a_process_that_is_no_launcher_stands_for_itself():
    assert processes.workers(os.getpid()) == [os.getpid()]


def test_the_probe_loads_from_perfmons_installation_with_its_dependencies():
    paths = injector._paths()
    assert os.path.isdir(os.path.join(paths[0], "probe"))
    for name in target_side.DEPENDENCIES:
        assert any(os.path.isdir(os.path.join(p, name)) or os.path.isfile(os.path.join(p, f"{name}.py"))
                   for p in paths), name


def test_the_injected_code_answers_through_its_file_and_binds_nothing(tmp_path):
    result = str(tmp_path / "answer.json")
    namespace = {"__name__": "__main__"}
    exec(target_side.payload("detach", [], result), namespace)
    wait_for(lambda: os.path.exists(result), what="the injected thread's answer")
    with open(result) as f:
        assert json.load(f) == {"ok": False, "message": "no probe injected by perfmon in this process"}
    assert set(namespace) == {"__name__", "__builtins__"}


def test_a_probe_not_started_by_inject_refuses_detach():
    assert target_side.detach_request("/tmp/x.json") == \
        "this probe was not started by perfmon inject; stop it where it was started"


def test_attach_to_a_process_without_a_probe_says_how_to_inject():
    pid = os.getppid()          # alive, and no probe of this test run is in it
    with pytest.raises(UserError) as err:
        discovery.resolve_live(str(pid))
    assert str(err.value) == (f"process {pid} has no perfmon probe: `perfmon inject {pid}` starts one in it "
                              "without a restart (docs/attach.md)")


def test_attach_to_a_pid_that_is_gone_says_so():
    with pytest.raises(UserError, match=f"no process {1 << 30} "):
        discovery.resolve_live(str(1 << 30))


def test_a_process_that_has_perfmons_probe_already_is_not_entered_again(tmp_path):
    importlib.import_module("probe.core")     # this process has perfmon's probe, whatever ran before
    result = str(tmp_path / "answer.json")
    exec(target_side.payload("inject", ["/nonexistent"], result), {"__name__": "__main__"})
    wait_for(lambda: os.path.exists(result), what="the injected thread's answer")
    with open(result) as f:
        assert json.load(f) == {"ok": False, "message": "a perfmon probe is already in this process: perfmon attach it"}
    assert "/nonexistent" not in sys.path


def test_a_socket_path_too_long_for_a_unix_socket_is_refused_before_any_hook(monkeypatch):
    """The probe would start with no live view, and ``perfmon inject`` would wait for a socket that
    cannot appear: the injected install says why at once and leaves nothing installed."""
    from probe import auto

    deep = "/tmp/" + "d" * 80
    monkeypatch.setenv("PERFMON_DIR", deep)
    monkeypatch.delenv("PERFMON_JOB", raising=False)
    answer = target_side.install(set(sys.modules), job="a-job")
    path = f"{deep}/a-job.r0.x0.p{os.getpid()}.sock"
    assert answer == {"ok": False, "message": f"the socket path {path} is {len(path)} bytes, over the 107 a Unix "
                                              "socket takes: set PERFMON_DIR to a shorter directory"}
    assert not auto.active() and not target_side.installed()
    monkeypatch.setenv("PERFMON_DIR", "/tmp/" + "d" * 60)      # 107 bytes or less: no refusal for the path
    from probe import lifecycle
    assert lifecycle.socket_path("a-job").name == f"a-job.r0.x0.p{os.getpid()}.sock"


def test_the_code_enters_through_a_thread_parked_in_the_kernel_never_a_busy_one():
    parked = threading.Event()
    waiter = threading.Thread(target=parked.wait, name="parked")
    waiter.start()
    try:
        tid = injector.entry_thread(os.getpid())
        assert tid != threading.get_native_id()      # this thread is running the test, not parked
        assert Path(f"/proc/{os.getpid()}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "S"
    finally:
        parked.set()
        waiter.join()


@pytest.mark.parametrize("cmdline, name", [
    (["/usr/bin/python3", "-u", "train.py", "--lr", "3"], "train"),        # a torchrun worker
    (["/v/bin/python", "-X", "dev", "-W", "ignore", "src/fit.py"], "fit"),
    (["python3.11", "-Xdev", "-OO", "-mpkg.train"], "train"),
    (["python", "-m", "pkg.train", "x.py"], "train"),
    (["python", "-uB", "--", "x.py"], "x"),
    (["python", "--check-hash-based-pycs", "always", "y.py"], "y"),
    (["python3", "-c", "import train"], "python"),
    (["python3"], None),                                                   # an interactive interpreter
    (["/usr/bin/bash", "train.py"], None),                                 # not Python
])
def test_the_job_name_of_a_process_is_its_scripts_as_the_probe_names_it(cmdline, name):
    assert processes.script_name(cmdline) == name


def test_no_process_of_a_job_is_one_line_that_says_what_was_looked_for():
    with pytest.raises(UserError, match="no process of job no-such-job on this node .*no-such-job.py"):
        processes.job_processes("no-such-job")


def _args(**given) -> argparse.Namespace:
    from tui.cli import build_parser
    argv = [str(given.pop("pid"))] if "pid" in given else []
    for key, value in given.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    return build_parser().parse_args(["inject", *argv])


@pytest.mark.parametrize("given, message", [
    ({}, "give a PID or --job NAME"),
    ({"pid": 12, "job": "train"}, "give a PID or --job NAME"),
])
def test_inject_needs_one_of_a_pid_and_a_job(given, message):
    with pytest.raises(UserError, match=message):
        fanout.chosen(_args(**given))


@pytest.mark.parametrize("given, message", [
    ({"pid": 12, "hosts": "n01"}, "a PID is a process of one node: name the job on those hosts with --job NAME"),
    ({"hosts": "n01"}, "name the job on those hosts with --job NAME"),
    ({"job": "train", "via": "ssh {host}"}, "--via goes with --hosts"),
    ({"job": "train", "hosts": "n01", "slurm": "7"}, "give only one of"),
])
def test_a_job_across_nodes_is_named_by_job_and_hosts(given, message):
    with pytest.raises(UserError, match=message):
        fanout.across_hosts(_args(**given))


def test_hosts_and_transport_across_nodes(monkeypatch):
    monkeypatch.delenv("PERFMON_VIA", raising=False)
    assert fanout.across_hosts(_args(job="train")) is None
    assert fanout.across_hosts(_args(job="train", hosts="n[01-02]")) == (["n01", "n02"],
                                                                          "ssh -T -o BatchMode=yes {host}")
    monkeypatch.setenv("PERFMON_VIA", "srun --overlap -w {host}")
    assert fanout.across_hosts(_args(job="train", hosts="g7"))[1] == "srun --overlap -w {host}"


def test_what_the_hosts_said_is_relayed_under_each_hosts_name_and_failures_are_one_line(capsys):
    from tui.stream.hosts import HostRun
    results = [HostRun("n01", 0, "injected 7: job t rank 0 (/s)\n", "perfmon inject: 7: dormant hooks installed\n"),
               HostRun("n02", 2, "", "perfmon inject: no process of job t on this node\n"),
               HostRun("n03", 255, "", "")]
    fanout.relay_output("inject", results[:1])
    out, err = capsys.readouterr()
    assert out == "n01: injected 7: job t rank 0 (/s)\n"
    assert err == "perfmon inject: n01: 7: dormant hooks installed\n"
    assert fanout.host_failures("inject", results) == ("n02: no process of job t on this node; "
                                                         "n03: exit status 255")


# --- the entry method: sys.remote_exec (Python 3.14+, PEP 768) or ptrace ---------------------------

@pytest.mark.parametrize("cmdline, environ, why", [
    (["python3.14", "train.py"], {}, None),
    (["python3.14", "-X", "disable-remote-debug", "train.py"], {}, "started with -X disable-remote-debug"),
    (["python3.14", "-Xdisable-remote-debug=0", "-u", "train.py"], {}, "started with -X disable-remote-debug=0"),
    (["python3.14", "-X", "disable_remote_debug", "train.py"], {}, "started with -X disable_remote_debug"),
    (["python3.14", "-uX", "dev", "-X", "disable-remote-debug", "-m", "pkg.train"], {}, "-X disable-remote-debug"),
    (["python3.14", "train.py", "-X", "disable-remote-debug"], {}, None),          # the script's arguments
    (["python3.14", "-c", "pass", "-X", "disable-remote-debug"], {}, None),
    (["python3.14", "train.py"], {"PYTHON_DISABLE_REMOTE_DEBUG": "1"}, "environment sets PYTHON_DISABLE_REMOTE_DEBUG"),
    (["python3.14", "train.py"], {"PYTHON_DISABLE_REMOTE_DEBUG": ""}, "environment sets PYTHON_DISABLE_REMOTE_DEBUG"),
    (["python3.14", "-E", "train.py"], {"PYTHON_DISABLE_REMOTE_DEBUG": "1"}, None),  # -E, -I: environment ignored
    (["python3.14", "-sI", "train.py"], {"PYTHON_DISABLE_REMOTE_DEBUG": "1"}, None),
])
def test_remote_debugging_off_is_read_from_the_targets_command_line_and_environment(cmdline, environ, why):
    got = injector.remote_debug_off(cmdline, environ)
    assert got is None if why is None else why in got


def test_this_perfmon_sends_remote_exec_only_on_python_3_14_with_remote_debugging_on():
    why = injector._local_remote_exec()
    if sys.version_info < (3, 14):
        assert why == f"sys.remote_exec needs CPython 3.14 or newer (this perfmon runs 3.{sys.version_info[1]})"
    else:
        assert (why is None) == sys.is_remote_debug_enabled()


@pytest.mark.parametrize("local, environ, asked, method", [
    (None, {}, "auto", "remote-exec"),
    (None, {"PYTHON_DISABLE_REMOTE_DEBUG": "1"}, "auto", "ptrace"),
    ("sys.remote_exec needs CPython 3.14 or newer", {}, "auto", "ptrace"),
    (None, {}, "ptrace", "ptrace"),
    (None, {}, "remote-exec", "remote-exec"),
    (None, {"PYTHON_DISABLE_REMOTE_DEBUG": "1"}, "remote-exec",
     "cannot enter {pid}: remote debugging is off in {pid}: its environment sets PYTHON_DISABLE_REMOTE_DEBUG"),
    ("sys.remote_exec needs CPython 3.14 or newer", {}, "remote-exec",
     "cannot enter {pid}: sys.remote_exec needs CPython 3.14 or newer"),
])
def test_the_entry_method_auto_takes_remote_exec_where_both_sides_allow_it(monkeypatch, local, environ, asked, method):
    monkeypatch.setattr(injector, "_local_remote_exec", lambda: local)
    monkeypatch.setattr(injector, "environ_of", lambda pid: environ)
    pid = os.getpid()
    if method in injector.METHODS:
        target = injector.check(pid, asked)
        assert (target.method, target.asked) == (method, asked != "auto")
    else:                                   # refused before anything is touched, with the way out
        with pytest.raises(UserError) as err:
            injector.check(pid, asked)
        assert str(err.value).startswith(f"--method remote-exec {method.format(pid=pid)}")
        assert str(err.value).endswith("--method ptrace enters it through ptrace (docs/attach.md)")


def test_the_method_is_a_cli_option_of_inject_and_detach():
    from tui.cli import build_parser
    assert build_parser().parse_args(["inject", "7"]).method == "auto"
    assert build_parser().parse_args(["detach", "7", "--method", "remote-exec"]).method == "remote-exec"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["inject", "7", "--method", "gdb"])


@pytest.fixture
def remote(monkeypatch, tmp_path):
    """``run`` through remote-exec on this process, with ``sys.remote_exec`` standing in for CPython
    3.14's: ``sent`` lists the entry files it was given; ``arrive`` (set by a test) is what the
    target's main thread does with one. The answer directories go to ``tmp_path``."""
    monkeypatch.setattr(injector.tempfile, "tempdir", str(tmp_path))
    sent: list[str] = []
    state = {"arrive": None, "raise": None}

    def remote_exec(pid: int, path: str) -> None:
        assert pid == os.getpid()
        if state["raise"] is not None:
            raise state["raise"]
        sent.append(path)
        if state["arrive"] is not None:
            state["arrive"](path)
    monkeypatch.setattr(sys, "remote_exec", remote_exec, raising=False)
    return sent, state


def _main_thread_runs(path: str) -> None:
    """What CPython does at the safe point: the file, in a fresh namespace."""
    with open(path) as f:
        exec(compile(f.read(), path, "exec"), {})


def _target(asked: bool = True) -> injector.Target:
    return injector.Target(os.getpid(), sys.executable, "remote-exec", asked)


def test_remote_exec_runs_the_entry_file_once_the_main_thread_claims_it(remote, tmp_path):
    sent, state = remote
    state["arrive"] = lambda path: threading.Thread(target=_main_thread_runs, args=(path,)).start()
    answer = injector.run(_target(), "detach", timeout=10, reach=10)
    assert answer == {"ok": False, "message": "no probe injected by perfmon in this process"}   # BOOT ran
    assert len(sent) == 1 and os.path.basename(sent[0]) == "entry.py"
    assert list(tmp_path.iterdir()) == []           # the answer directory is gone


def test_a_main_thread_late_past_the_timeout_finds_perfmon_withdrawn_and_runs_nothing(remote, tmp_path):
    sent, state = remote
    with pytest.raises(UserError) as err:
        injector.run(_target(), "inject", timeout=10, reach=0.2)
    assert str(err.value) == (f"the main thread of {os.getpid()} did not reach a point where Python runs code "
                              "within 0.2 s (a long call outside Python?); perfmon withdrew: nothing of it ran there, "
                              "and nothing will; --method ptrace enters through a parked thread")
    [entry] = sent
    directory = os.path.dirname(entry)
    assert os.listdir(directory) == ["entry.py"]     # kept for the main thread: a missing file is an error there
    threads = set(threading.enumerate())
    _main_thread_runs(entry)                        # it gets there at last
    assert not os.path.exists(directory)            # removed its directory, wrote no answer
    assert set(threading.enumerate()) == threads    # and started nothing
    assert "probe.inject" in sys.modules and not target_side.installed()


def test_a_main_thread_that_claims_the_entry_as_perfmon_gives_up_is_waited_for(remote, monkeypatch):
    sent, state = remote
    real_unlink = os.unlink
    raced: list[str] = []

    def unlink(path, *args, **kwargs):
        if os.path.basename(str(path)) == injector.WANTED and not raced:
            raced.append(str(path))                 # perfmon withdraws; the main thread's claim lands first
            _main_thread_runs(sent[0])
        return real_unlink(path, *args, **kwargs)
    monkeypatch.setattr(os, "unlink", unlink)
    answer = injector.run(_target(), "detach", timeout=10, reach=0.1)
    assert raced and answer["message"] == "no probe injected by perfmon in this process"


@pytest.mark.parametrize("raised, message", [
    (RuntimeError("Remote debugging is not enabled in the remote process"),
     "sys.remote_exec could not enter {pid}: remote debugging is off in it (PYTHON_DISABLE_REMOTE_DEBUG, "
     "-X disable-remote-debug, or a Python built --without-remote-debug)"),
    (RuntimeError("Can't send commands from a Python 3.14 process to a Python 3.13 process"),
     "sys.remote_exec could not enter {pid}: Can't send commands from a Python 3.14 process to a Python 3.13 process"),
    (PermissionError(1, "Operation not permitted"),
     "no ptrace rights over {pid}: the kernel denied access to its memory"),
])
def test_what_sys_remote_exec_raises_is_one_line(remote, raised, message):
    sent, state = remote
    state["raise"] = raised
    with pytest.raises(UserError) as err:
        injector.run(_target(), "inject", reach=1)
    assert str(err.value).startswith(message.format(pid=os.getpid()))


def test_auto_falls_back_to_ptrace_when_remote_exec_is_refused(remote, monkeypatch):
    sent, state = remote
    state["raise"] = RuntimeError("Remote debugging is not enabled in the remote process")
    entered = []
    monkeypatch.setattr(injector, "entry_thread", lambda pid: 1)
    monkeypatch.setattr(injector, "_enter", lambda pid, tid, code, seconds: entered.append(code))
    monkeypatch.setattr(injector, "_await", lambda pid, result, timeout: {"ok": True, "message": "entered"})
    find_spec = injector.importlib.util.find_spec
    monkeypatch.setattr(injector.importlib.util, "find_spec",
                        lambda name: object() if name == "hypno" else find_spec(name))     # hypno is there
    assert injector.run(_target(asked=False), "inject", reach=1)["message"] == "entered"
    assert len(entered) == 1 and entered[0].startswith("exec(")      # the same statement, through ptrace
    monkeypatch.setattr(injector.importlib.util, "find_spec",
                        lambda name: None if name == "hypno" else find_spec(name))         # hypno is not
    with pytest.raises(UserError) as err:
        injector.run(_target(asked=False), "inject", reach=1)
    assert str(err.value) == (f"entering {os.getpid()} through ptrace needs hypno: pip install 'perfmon[inject]' "
                              "(sys.remote_exec could not: remote debugging is off in it (PYTHON_DISABLE_REMOTE_DEBUG, "
                              "-X disable-remote-debug, or a Python built --without-remote-debug))")
