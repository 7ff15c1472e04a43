"""Entering a running Python process to start or remove the probe (``perfmon inject`` / ``detach``).

Every check that can refuse runs before the target is touched, from ``/proc`` alone: the
process exists, this user may ptrace it (``sys.remote_exec`` writes its memory under the same
rule), it is CPython of this interpreter's minor version (the probe and its compiled
dependencies load from perfmon's own installation), it has loaded torch, and the entry method
asked for can work (``entry_method``). Then ``probe.inject.payload`` runs in it: through
``sys.remote_exec`` (Python 3.14+, PEP 768) on its main thread at the next safe point, or
through ``hypno`` (ptrace: ``pyinjector``) on a thread parked in a blocking system call
(``entry_thread``); the code answers through a file in a private directory. A torchrun
launcher's PID stands for its workers on this node; ``job_processes`` finds a job's processes
on this node by the name perfmon would give it. Refusals are ``UserError``: one line, with the fix.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from probe import inject as target_side
from tui.errors import UserError
from tui.processes import environ_of, python_command

ANSWER_SECONDS = 15.0          # the target's injected thread loads the probe and answers


ENTER_SECONDS = 10.0           # ptrace, dlopen and the code run on the interrupted thread


POLL = 0.05


SAFE_SECONDS = 5.0             # to find a thread parked in the kernel


PARK_SAMPLE = 0.02


_ENTER = ("import sys\nfrom hypno import inject_py\ntry:\n    inject_py(int(sys.argv[1]), sys.stdin.read())\n"
          "except Exception as exc:\n    sys.exit(f'{type(exc).__name__}: {exc}'.splitlines()[0])\n")


# system calls a thread may make while it holds malloc's lock: a thread in one is not parked
MEMORY_SYSCALLS = {"x86_64": {9, 10, 11, 12, 25, 28}, "aarch64": {214, 215, 216, 222, 226, 233}}


CAP_SYS_PTRACE = 19


METHODS = ("auto", "remote-exec", "ptrace")


WANTED = "wanted"        # the marker the remote-exec entry file claims (probe.inject.ENTRY)


_LIBPYTHON = re.compile(r"libpython(\d+)\.(\d+)")


_EXE_VERSION = re.compile(r"python(\d+)\.(\d+)")


@dataclass(frozen=True)
class Target:
    """A process that passed every check."""

    pid: int
    exe: str
    method: str = "ptrace"      # how ``run`` enters it: "remote-exec" or "ptrace"
    asked: bool = False         # the user named that method (no falling back to the other)


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def _status_ids(pid: int, field: str) -> list[int]:
    for line in _read(f"/proc/{pid}/status").splitlines():
        if line.startswith(field + ":"):
            return [int(x) for x in line.split()[1:]]
    return []


def _can_ptrace_any() -> bool:
    """CAP_SYS_PTRACE in this process's effective set."""
    for line in _read("/proc/self/status").splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> CAP_SYS_PTRACE & 1)
    return False


def _ptrace_scope() -> int:
    try:
        return int(_read("/proc/sys/kernel/yama/ptrace_scope").strip())
    except (OSError, ValueError):
        return 0


def why_no_rights() -> str | None:
    """Why perfmon may not trace even a process of its own user here; None when it may."""
    scope = _ptrace_scope()
    if _can_ptrace_any():
        return "kernel.yama.ptrace_scope is 3 (no process may trace another)" if scope >= 3 else None
    if scope == 1:
        return "kernel.yama.ptrace_scope is 1 (only a parent may trace)"
    if scope >= 2:
        return f"kernel.yama.ptrace_scope is {scope}"
    return None


def _no_rights(pid: int, why: str) -> UserError:
    return UserError(f"no ptrace rights over {pid}: {why}; run perfmon as the job's user with "
                     "kernel.yama.ptrace_scope 0, or with CAP_SYS_PTRACE (docs/attach.md)")


def check(pid: int, method: str = "auto") -> Target:
    """The target, entered by ``method`` (``METHODS``), or a UserError saying why perfmon will not
    enter it. Touches nothing."""
    proc = f"/proc/{pid}"
    if pid <= 0 or not os.path.exists(proc):
        raise UserError(f"no process {pid} (has it exited?)")
    try:
        uids = _status_ids(pid, "Uid")
    except OSError:
        raise UserError(f"no process {pid} (has it exited?)") from None
    if not _can_ptrace_any() and uids and any(uid != os.geteuid() for uid in uids[:3]):
        raise _no_rights(pid, f"it runs as uid {uids[1]}, perfmon as uid {os.geteuid()}")
    why = why_no_rights()
    if why is not None:
        raise _no_rights(pid, why)
    try:
        exe = os.readlink(f"{proc}/exe")
        maps = _read(f"{proc}/maps")
    except FileNotFoundError:
        raise UserError(f"no process {pid} (has it exited?)") from None
    except PermissionError:
        raise _no_rights(pid, "its memory map cannot be read") from None
    version = _python_version(exe, maps)
    name = os.path.basename(exe)
    if version is None:
        if "pypy" in name or "graalpy" in name:
            raise UserError(f"{pid} runs {name}, not CPython: perfmon inject enters CPython only")
        raise UserError(f"{pid} is not a Python process ({exe})")
    ours = sys.version_info[:2]
    if version != ours:
        raise UserError(f"{pid} runs Python {version[0]}.{version[1]}, this perfmon runs {ours[0]}.{ours[1]}: "
                        f"install perfmon into a Python {version[0]}.{version[1]} environment and run its "
                        "`perfmon inject`")
    if "libtorch" not in maps:
        raise UserError(f"{pid} has not loaded torch: nothing for the probe to measure")
    return Target(pid, exe, entry_method(pid, method), method != "auto")


def entry_method(pid: int, asked: str = "auto") -> str:
    """How perfmon enters ``pid``: "remote-exec" when asked, or for "auto" when both this perfmon's
    Python and the target's allow it; else "ptrace". A UserError when remote-exec is asked and
    cannot work."""
    if asked == "ptrace":
        return "ptrace"
    why = why_not_remote_exec(pid)
    if why is None:
        return "remote-exec"
    if asked == "remote-exec":
        raise UserError(f"--method remote-exec cannot enter {pid}: {why}; --method ptrace enters it through "
                        "ptrace (docs/attach.md)")
    return "ptrace"


def why_not_remote_exec(pid: int) -> str | None:
    """Why ``sys.remote_exec`` cannot enter ``pid``, from this interpreter and the target's command
    line and starting environment; None when nothing known stops it."""
    why = _local_remote_exec()
    if why is not None:
        return why
    try:
        cmdline = _read(f"/proc/{pid}/cmdline").split("\0")[:-1]
    except OSError:
        cmdline = []
    off = remote_debug_off(cmdline, environ_of(pid))
    return None if off is None else f"remote debugging is off in {pid}: {off}"


def _local_remote_exec() -> str | None:
    """Why this perfmon's Python cannot send ``sys.remote_exec``; None when it can."""
    if sys.version_info < (3, 14):
        return (f"sys.remote_exec needs CPython 3.14 or newer (this perfmon runs "
                f"{sys.version_info[0]}.{sys.version_info[1]})")
    if not sys.is_remote_debug_enabled():
        return ("remote debugging is off in perfmon's own Python (PYTHON_DISABLE_REMOTE_DEBUG, "
                "-X disable-remote-debug, or a build --without-remote-debug)")
    return None


def remote_debug_off(cmdline: list[str], environ: dict[str, str]) -> str | None:
    """Why a CPython started with ``cmdline`` and ``environ`` has remote debugging off; None when
    neither turns it off. CPython 3.14 turns it off for ``-X disable-remote-debug[=anything]`` and
    for ``PYTHON_DISABLE_REMOTE_DEBUG`` set to any value, empty included, unless ``-E`` or ``-I``
    has it ignore the environment. It ignores the ``disable_remote_debug`` spelling its
    documentation gives; perfmon honours that too, as the intent it states."""
    command = python_command(cmdline)
    for option in command.xoptions:
        if option.split("=", 1)[0] in ("disable-remote-debug", "disable_remote_debug"):
            return f"it was started with -X {option}"
    if "PYTHON_DISABLE_REMOTE_DEBUG" in environ and not command.flags & {"E", "I"}:
        return "its environment sets PYTHON_DISABLE_REMOTE_DEBUG"
    return None


def _python_version(exe: str, maps: str) -> tuple[int, int] | None:
    """CPython's minor version from the process's libpython, else from its executable's name."""
    found = _LIBPYTHON.search(maps) or _EXE_VERSION.fullmatch(os.path.basename(exe).rstrip("dmu"))
    return (int(found.group(1)), int(found.group(2))) if found else None


def _paths() -> list[str]:
    """Where the target finds perfmon's probe and the probe's dependencies: this installation."""
    found = [str(Path(target_side.__file__).resolve().parents[1])]
    for name in target_side.DEPENDENCIES:
        spec = importlib.util.find_spec(name)
        where = (next(iter(spec.submodule_search_locations)) if spec.submodule_search_locations else spec.origin) \
            if spec is not None else None
        if where is None:
            raise UserError(f"perfmon's installation lacks {name}; reinstall perfmon")
        root = str(Path(where).resolve().parent)     # a package's directory or a module file: its parent
        if root not in found:
            found.append(root)
    return found


def _answer_dir(pid: int) -> str:
    """A private directory the target writes its answer to (handed to it when it runs as another user)."""
    directory = tempfile.mkdtemp(prefix="perfmon-inject-")
    _give(directory, pid)
    return directory


def _give(path: str, pid: int) -> None:
    """Make ``path`` the target's user's, when that is not perfmon's: entered with CAP_SYS_PTRACE,
    the target reads its entry file and answers as its own user."""
    uid = _status_ids(pid, "Uid")[1]
    if uid != os.geteuid():
        os.chown(path, uid, -1)


def _await(pid: int, result: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while not os.path.exists(result):
        if time.monotonic() > deadline:
            raise UserError(f"{pid} did not answer within {timeout:.0f} s; its perfmon thread may still finish")
        if not os.path.exists(f"/proc/{pid}"):
            raise UserError(f"{pid} exited")
        time.sleep(POLL)
    with open(result, encoding="utf-8") as f:
        return json.load(f)


class RemoteExecFailed(Exception):
    """``sys.remote_exec`` refused before writing anything into the target."""


def run(target: Target, action: str, timeout: float = ANSWER_SECONDS, job: str | None = None,
        reach: float = ANSWER_SECONDS, enter: float = ENTER_SECONDS) -> dict:
    """Run ``action`` ("inject" or "detach") in the target by its method; its answer (``ok``,
    ``message``, ...). ``job``: the name the injected probe serves the job under. ``reach``: how
    long the target's main thread may take to reach a safe point (remote-exec); ``enter``: how long
    entering through ptrace may take (a loaded host starts the injector's process slowly)."""
    if target.method == "ptrace":
        _need_hypno(target.pid)
    made = _answer_dir(target.pid)
    directory: str | None = made          # None once it is no longer this command's to remove
    try:
        result = os.path.join(made, "answer.json")
        paths = _paths()
        if target.method == "remote-exec":
            wanted = os.path.join(made, WANTED)
            try:
                reached = _remote_exec(target.pid, target_side.entry_script(action, paths, result, wanted, job),
                                       wanted, reach)
            except RemoteExecFailed as exc:
                if target.asked:
                    raise UserError(f"sys.remote_exec could not enter {target.pid}: {exc}") from None
                _need_hypno(target.pid, f"sys.remote_exec could not: {exc}")
                reached = None
            if reached is False:
                directory = None        # the entry file removes it, should the main thread ever run it
                raise UserError(f"the main thread of {target.pid} did not reach a point where Python runs code "
                                f"within {reach:g} s (a long call outside Python?); perfmon withdrew: nothing of it "
                                "ran there, and nothing will; --method ptrace enters through a parked thread")
            if reached is not None:
                return _await(target.pid, result, timeout)
        _enter(target.pid, entry_thread(target.pid), target_side.payload(action, paths, result, job), enter)
        return _await(target.pid, result, timeout)
    finally:
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)


def _need_hypno(pid: int, because: str | None = None) -> None:
    if importlib.util.find_spec("hypno") is None:
        if because is None and hasattr(sys, "remote_exec"):
            because = why_not_remote_exec(pid)
        raise UserError(f"entering {pid} through ptrace needs hypno: pip install 'perfmon[inject]'"
                        + (f" ({because})" if because else ""))


def _remote_exec(pid: int, script: str, wanted: str, reach: float) -> bool:
    """Have ``pid``'s main thread run ``script`` at its next safe point (``sys.remote_exec``). True
    once it has claimed ``wanted``; False when it did not within ``reach`` s and perfmon took the
    marker back, so that the script, should it run later, does nothing but remove its directory.
    ``RemoteExecFailed`` when the interpreter refused before writing anything into the target."""
    entry = os.path.join(os.path.dirname(wanted), "entry.py")
    for path, text in ((wanted, ""), (entry, script)):
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        _give(path, pid)
    try:
        sys.remote_exec(pid, entry)  # type: ignore[attr-defined]   # 3.14's; mypy checks against 3.10
    except PermissionError:
        raise _no_rights(pid, "the kernel denied access to its memory") from None
    except (RuntimeError, OSError, ValueError) as exc:
        raise RemoteExecFailed(_remote_exec_error(str(exc))) from None
    deadline = time.monotonic() + reach
    while os.path.exists(wanted):
        if not os.path.exists(f"/proc/{pid}"):
            raise UserError(f"{pid} exited")
        if time.monotonic() > deadline:
            try:
                os.unlink(wanted)
            except FileNotFoundError:
                return True             # claimed at the last moment
            return False
        time.sleep(POLL)
    return True


def _remote_exec_error(text: str) -> str:
    first = (text.strip().splitlines() or ["it failed"])[0]
    if "not enabled in the remote process" in first:
        return ("remote debugging is off in it (PYTHON_DISABLE_REMOTE_DEBUG, -X disable-remote-debug, or a "
                "Python built --without-remote-debug)")
    return first


def entry_thread(pid: int, seconds: float = SAFE_SECONDS) -> int:
    """A thread of ``pid`` parked in a blocking system call, to run the injected code on.

    ptrace stops only the thread it enters, and ``dlopen`` then runs on it: a thread stopped
    inside ``malloc`` or the loader holds the very lock ``dlopen`` needs and would wait for
    itself for ever. A thread seen in the same blocking call (not a memory-mapping one) twice,
    ``PARK_SAMPLE`` apart, holds none of them. Found within ``seconds``, else a UserError."""
    memory_calls = MEMORY_SYSCALLS.get(platform.machine(), set())
    deadline = time.monotonic() + seconds
    before: dict[int, str] = {}
    while True:
        now: dict[int, str] = {}
        try:
            tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
        except FileNotFoundError:
            raise UserError(f"no process {pid} (has it exited?)") from None
        for tid in tids:
            try:
                call = _read(f"/proc/{pid}/task/{tid}/syscall").split()[0]
                state = _read(f"/proc/{pid}/task/{tid}/stat").rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state == "S" and call.isdigit() and int(call) not in memory_calls:
                now[tid] = call
        parked = [tid for tid, call in now.items() if before.get(tid) == call]
        if parked:
            return parked[0]
        if time.monotonic() > deadline:
            raise UserError(f"no thread of {pid} was waiting in the kernel within {seconds:g} s, the only moment "
                            "it is safe to enter (docs/attach.md); try again")
        before = now
        time.sleep(PARK_SAMPLE)


def _enter(pid: int, tid: int, code: str, seconds: float) -> None:
    """Run ``code`` in ``pid`` on thread ``tid`` through hypno, in a child process: pyinjector keeps
    the GIL while it works, so only a process of its own can be given up on after ``seconds``."""
    try:
        out = subprocess.run([sys.executable, "-c", _ENTER, str(tid)], input=code, capture_output=True, text=True,
                             timeout=seconds)
    except subprocess.TimeoutExpired:
        raise UserError(f"entering {pid} did not finish within {seconds:g} s: the process may be stuck in "
                        "the dynamic loader (docs/attach.md)") from None
    if out.returncode != 0:
        text = (out.stderr.strip().splitlines() or ["the injector failed"])[-1]
        if "Permission" in text or "Operation not permitted" in text:
            raise _no_rights(pid, "ptrace was denied")
        if not os.path.exists(f"/proc/{pid}"):
            raise UserError(f"no process {pid} (has it exited?)")
        raise UserError(f"could not enter {pid}: {text}")


def detach(target: Target, timeout: float = ANSWER_SECONDS) -> dict:
    """Remove the injected probe: asked over its socket when it serves one, else through ptrace
    (still dormant: no probe thread runs yet)."""
    from tui.stream import discovery
    from tui.stream.requests import Target as Socket, ask

    endpoint = next((ep for ep in discovery.list_endpoints() if ep.pid == target.pid), None)
    if endpoint is None:
        return run(target, "detach", timeout, enter=max(ENTER_SECONDS, timeout))
    directory = _answer_dir(target.pid)
    try:
        result = os.path.join(directory, "answer.json")
        try:
            ask(Socket(path=endpoint.socket), "detach", {"result": result}, timeout)
        except UserError as exc:
            return {"ok": False, "message": str(exc).split(": detach refused: ")[-1]}
        return _await(target.pid, result, timeout)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
