"""``perfmon inject`` / ``detach`` without entering any process: the checks that refuse from
/proc alone, the code the target runs (here, in this process), and ``perfmon attach`` on a
process with no probe. The injections themselves: tests/integration/test_inject.py."""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from pathlib import Path

import pytest
import torch  # noqa: F401  (this process must have loaded torch for check() to accept it)

from probe import inject as target_side
from tests.integration.streamutil import wait_for
from tui import injector
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
    assert injector.workers(os.getpid()) == [os.getpid()]


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
    result = str(tmp_path / "answer.json")
    exec(target_side.payload("inject", ["/nonexistent"], result), {"__name__": "__main__"})
    wait_for(lambda: os.path.exists(result), what="the injected thread's answer")
    with open(result) as f:
        assert json.load(f) == {"ok": False, "message": "a perfmon probe is already in this process: perfmon attach it"}
    assert "/nonexistent" not in sys.path


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
    assert injector.script_name(cmdline) == name


def test_no_process_of_a_job_is_one_line_that_says_what_was_looked_for():
    with pytest.raises(UserError, match="no process of job no-such-job on this node .*no-such-job.py"):
        injector.job_processes("no-such-job")


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
        injector.chosen(_args(**given))


@pytest.mark.parametrize("given, message", [
    ({"pid": 12, "hosts": "n01"}, "a PID is a process of one node: name the job on those hosts with --job NAME"),
    ({"hosts": "n01"}, "name the job on those hosts with --job NAME"),
    ({"job": "train", "via": "ssh {host}"}, "--via goes with --hosts"),
    ({"job": "train", "hosts": "n01", "slurm": "7"}, "give only one of"),
])
def test_a_job_across_nodes_is_named_by_job_and_hosts(given, message):
    with pytest.raises(UserError, match=message):
        injector.across_hosts(_args(**given))


def test_hosts_and_transport_across_nodes(monkeypatch):
    monkeypatch.delenv("PERFMON_VIA", raising=False)
    assert injector.across_hosts(_args(job="train")) is None
    assert injector.across_hosts(_args(job="train", hosts="n[01-02]")) == (["n01", "n02"],
                                                                          "ssh -T -o BatchMode=yes {host}")
    monkeypatch.setenv("PERFMON_VIA", "srun --overlap -w {host}")
    assert injector.across_hosts(_args(job="train", hosts="g7"))[1] == "srun --overlap -w {host}"


def test_what_the_hosts_said_is_relayed_under_each_hosts_name_and_failures_are_one_line(capsys):
    from tui.stream.hosts import HostRun
    results = [HostRun("n01", 0, "injected 7: job t rank 0 (/s)\n", "perfmon inject: 7: dormant hooks installed\n"),
               HostRun("n02", 2, "", "perfmon inject: no process of job t on this node\n"),
               HostRun("n03", 255, "", "")]
    injector.relay_output("inject", results[:1])
    out, err = capsys.readouterr()
    assert out == "n01: injected 7: job t rank 0 (/s)\n"
    assert err == "perfmon inject: n01: 7: dormant hooks installed\n"
    assert injector.host_failures("inject", results) == ("n02: no process of job t on this node; "
                                                         "n03: exit status 255")
