"""The fast tier's guard (tests/conftest.py ``_no_process_in_fast_tests``): a test not marked
``slow`` fails as soon as it starts a process, whichever way it starts one. Each start below is
written so that, were it let through, it would start a harmless process and reap it (a fork's
child leaves at once), so a gap in the guard shows as this test failing, not as a stray pytest."""

from __future__ import annotations

import multiprocessing
import os
import subprocess

import pytest

from tests.conftest import ProcessInFastTest


def _forked(pid: int) -> None:
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


def _forkpty() -> None:
    pid, fd = os.forkpty()
    _forked(pid)
    os.close(fd)


def _posix_spawn(spawn) -> None:
    os.waitpid(spawn("/bin/true" if spawn is os.posix_spawn else "true", ["true"], dict(os.environ)), 0)


STARTS = {
    "subprocess.run": lambda: subprocess.run(["true"], check=False),
    "os.popen": lambda: os.popen("true").close(),
    "os.system": lambda: os.system("true"),
    "os.fork": lambda: _forked(os.fork()),
    "os.forkpty": _forkpty,
    "os.posix_spawn": lambda: _posix_spawn(os.posix_spawn),
    "os.posix_spawnp": lambda: _posix_spawn(os.posix_spawnp),
    "os.spawnv": lambda: os.spawnv(os.P_WAIT, "/bin/true", ["true"]),
    "os.spawnlp": lambda: os.spawnlp(os.P_WAIT, "true", "true"),
    "multiprocessing fork": lambda: multiprocessing.get_context("fork").Process(target=int).start(),
    "multiprocessing spawn": lambda: multiprocessing.get_context("spawn").Process(target=int).start(),
}


@pytest.mark.parametrize("start", list(STARTS.values()), ids=list(STARTS))
def test_a_fast_test_starting_a_process_fails_naming_the_slow_marker(start):
    with pytest.raises(ProcessInFastTest, match="mark it @pytest.mark.slow"):
        start()
