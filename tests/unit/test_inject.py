"""``perfmon inject`` / ``detach`` without entering any process: the checks that refuse from
/proc alone, the code the target runs (here, in this process), and ``perfmon attach`` on a
process with no probe. The injections themselves: tests/integration/test_inject.py."""

from __future__ import annotations

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


def test_a_process_that_is_no_launcher_stands_for_itself():
    assert injector.workers(os.getpid()) == [os.getpid()]


def test_the_probe_loads_from_perfmons_installation_with_its_dependencies():
    paths = injector._paths()
    assert os.path.isdir(os.path.join(paths[0], "probe"))
    for name in target_side.DEPENDENCIES:
        assert any(os.path.isdir(os.path.join(p, name)) for p in paths), name


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
