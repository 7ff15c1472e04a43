"""Entering a running Python process to start or remove the probe (``perfmon inject`` / ``detach``).

Every check that can refuse runs before the target is touched, from ``/proc`` alone: the
process exists, this user may ptrace it, it is CPython of this interpreter's minor version
(the probe and its compiled dependencies load from perfmon's own installation), and it has
loaded torch. Then ``hypno`` (ptrace: ``pyinjector``) runs ``probe.inject.payload`` in it, on
a thread parked in a blocking system call (``entry_thread``), and the code answers through a
file in a private directory. A torchrun launcher's PID stands for
its workers on this node. Refusals are ``UserError``: one line, with the fix.
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
LAUNCHERS = ("torch.distributed.run", "torch.distributed.launch", "torchrun")
_LIBPYTHON = re.compile(r"libpython(\d+)\.(\d+)")
_EXE_VERSION = re.compile(r"python(\d+)\.(\d+)")


@dataclass(frozen=True)
class Target:
    """A process that passed every check."""

    pid: int
    exe: str


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


def _no_rights(pid: int, why: str) -> UserError:
    return UserError(f"no ptrace rights over {pid}: {why}; run perfmon as the job's user with "
                     "kernel.yama.ptrace_scope 0, or with CAP_SYS_PTRACE (docs/attach.md)")


def check(pid: int) -> Target:
    """The target, or a UserError saying why perfmon will not enter it. Touches nothing."""
    proc = f"/proc/{pid}"
    if pid <= 0 or not os.path.exists(proc):
        raise UserError(f"no process {pid} (has it exited?)")
    try:
        uids = _status_ids(pid, "Uid")
    except OSError:
        raise UserError(f"no process {pid} (has it exited?)") from None
    privileged = _can_ptrace_any()
    scope = _ptrace_scope()
    if not privileged:
        if uids and any(uid != os.geteuid() for uid in uids[:3]):
            raise _no_rights(pid, f"it runs as uid {uids[1]}, perfmon as uid {os.geteuid()}")
        if scope >= 2:
            raise _no_rights(pid, f"kernel.yama.ptrace_scope is {scope}")
        if scope == 1:
            raise _no_rights(pid, "kernel.yama.ptrace_scope is 1 (only a parent may trace)")
    elif scope >= 3:
        raise _no_rights(pid, "kernel.yama.ptrace_scope is 3 (no process may trace another)")
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
    return Target(pid, exe)


def _python_version(exe: str, maps: str) -> tuple[int, int] | None:
    """CPython's minor version from the process's libpython, else from its executable's name."""
    found = _LIBPYTHON.search(maps) or _EXE_VERSION.fullmatch(os.path.basename(exe).rstrip("dmu"))
    return (int(found.group(1)), int(found.group(2))) if found else None


def workers(pid: int) -> list[int]:
    """A torchrun launcher's worker processes (its children), or ``[pid]`` for any other process."""
    try:
        cmdline = _read(f"/proc/{pid}/cmdline").split("\0")
    except OSError:
        return [pid]
    if not any(arg in LAUNCHERS or os.path.basename(arg) == "torchrun" for arg in cmdline[:3]):
        return [pid]
    children: list[int] = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = _read(f"/proc/{entry}/stat")
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                children.append(int(entry))
    if not children:
        raise UserError(f"{pid} is a torchrun launcher with no worker processes (yet?)")
    return sorted(children)


def _paths() -> list[str]:
    """Where the target finds perfmon's probe and the probe's dependencies: this installation."""
    found = [str(Path(target_side.__file__).resolve().parents[1])]
    for name in target_side.DEPENDENCIES:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise UserError(f"perfmon's installation lacks {name}; reinstall perfmon")
        root = str(Path(next(iter(spec.submodule_search_locations))).resolve().parent)
        if root not in found:
            found.append(root)
    return found


def _answer_dir(pid: int) -> str:
    """A private directory the target writes its answer to (handed to it when it runs as another user)."""
    directory = tempfile.mkdtemp(prefix="perfmon-inject-")
    uid = _status_ids(pid, "Uid")[1]
    if uid != os.geteuid():
        os.chown(directory, uid, -1)     # entered with CAP_SYS_PTRACE: the target answers as its own user
    return directory


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


def run(target: Target, action: str, timeout: float = ANSWER_SECONDS) -> dict:
    """Run ``action`` ("inject" or "detach") in the target through ptrace; its answer (``ok``,
    ``message``, ...)."""
    if importlib.util.find_spec("hypno") is None:
        raise UserError("perfmon inject needs hypno: pip install 'perfmon[inject]'")
    directory = _answer_dir(target.pid)
    try:
        result = os.path.join(directory, "answer.json")
        _enter(target.pid, entry_thread(target.pid), target_side.payload(action, _paths(), result))
        return _await(target.pid, result, timeout)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


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


def _enter(pid: int, tid: int, code: str) -> None:
    """Run ``code`` in ``pid`` on thread ``tid`` through hypno, in a child process: pyinjector keeps
    the GIL while it works, so only a process of its own can be given up on after ``ENTER_SECONDS``."""
    try:
        out = subprocess.run([sys.executable, "-c", _ENTER, str(tid)], input=code, capture_output=True, text=True,
                             timeout=ENTER_SECONDS)
    except subprocess.TimeoutExpired:
        raise UserError(f"entering {pid} did not finish within {ENTER_SECONDS:.0f} s: the process may be stuck in "
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
        return run(target, "detach", timeout)
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
