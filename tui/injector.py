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
from typing import Any

from probe import inject as target_side
from probe import paths
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
METHODS = ("auto", "remote-exec", "ptrace")
WANTED = "wanted"        # the marker the remote-exec entry file claims (probe.inject.ENTRY)
LAUNCHERS = ("torch.distributed.run", "torch.distributed.launch", "torchrun")
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
    off = remote_debug_off(cmdline, _environ(pid))
    return None if off is None else f"remote debugging is off in {pid}: {off}"


def _local_remote_exec() -> str | None:
    """Why this perfmon's Python cannot send ``sys.remote_exec``; None when it can."""
    if not hasattr(sys, "remote_exec"):
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


@dataclass(frozen=True)
class PythonCommand:
    """A CPython command line as the interpreter reads it: its one-letter flags and ``-X`` options
    (those before what it runs), and what it runs: ``kind`` "script" (``what`` its path), "module"
    (``-m``, the module's name), "command" (``-c``), or None (an interactive interpreter, stdin)."""

    flags: frozenset[str]
    xoptions: tuple[str, ...]
    kind: str | None
    what: str = ""


def python_command(cmdline: list[str]) -> PythonCommand:
    """``cmdline`` (the executable first) read as CPython reads its arguments."""
    flags: set[str] = set()
    xoptions: list[str] = []
    args = iter(cmdline[1:])
    for arg in args:
        if arg == "--check-hash-based-pycs":
            next(args, None)
        elif arg == "--":
            return PythonCommand(frozenset(flags), tuple(xoptions), "script", next(args, ""))
        elif arg.startswith("--"):
            continue
        elif arg == "-":
            break
        elif not arg.startswith("-"):
            return PythonCommand(frozenset(flags), tuple(xoptions), "script", arg)
        else:
            for i, flag in enumerate(arg[1:], start=1):
                if flag in "cm":
                    return PythonCommand(frozenset(flags), tuple(xoptions), "command" if flag == "c" else "module",
                                         arg[i + 1:] or next(args, ""))
                if flag in "WX":            # options with a value: attached, or the next argument
                    value = arg[i + 1:] or next(args, "")
                    if flag == "X":
                        xoptions.append(value)
                    break
                flags.add(flag)
    return PythonCommand(frozenset(flags), tuple(xoptions), None)


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
    if not _is_launcher(cmdline):
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


_PYTHON_EXE = re.compile(r"python(\d+(\.\d+)?)?[dmu]*")


def script_name(cmdline: list[str]) -> str | None:
    """The name perfmon gives a Python process's job by default (``probe.core``: the stem of its
    ``sys.argv[0]``), read from its command line; None for a process that is not a Python one or
    runs no script, module or command."""
    if not cmdline or not _PYTHON_EXE.fullmatch(os.path.basename(cmdline[0])):
        return None
    command = python_command(cmdline)
    if command.kind == "script":
        return Path(command.what).stem or "python"
    if command.kind == "module":
        return command.what.rsplit(".", 1)[-1] or "python"
    return "python" if command.kind == "command" else None


def _environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            items = f.read().split(b"\0")
    except OSError:
        return {}
    return dict(item.decode(errors="replace").split("=", 1) for item in items if b"=" in item)


def _parent(pid: int) -> int:
    try:
        return int(_read(f"/proc/{pid}/stat").rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _is_launcher(cmdline: list[str]) -> bool:
    return any(arg in LAUNCHERS or os.path.basename(arg) == "torchrun" for arg in cmdline[:3])


def job_processes(job: str) -> list[int]:
    """The processes of ``job`` on this node: Python processes with torch loaded whose job perfmon
    names ``job`` (their script's name, or with ``-<run id>`` under torchrun; ``PERFMON_JOB`` for a
    job that has a probe already), less torchrun launchers and DataLoader workers (the children of
    another such process). Processes of several distinct jobs by that name (no shared torchrun run
    or rendezvous) make a UserError: which one is meant is the user's to say, by PID."""
    wanted = paths.safe_job(job)
    found: dict[int, tuple[str, ...]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        pid = int(entry)
        try:
            cmdline = _read(f"/proc/{pid}/cmdline").split("\0")[:-1]
        except OSError:
            continue
        script = script_name(cmdline)
        if script is None or _is_launcher(cmdline):
            continue
        env = _environ(pid)
        run_id = env.get("TORCHELASTIC_RUN_ID", "none")
        names = {script, f"{script}-{run_id}", env.get("PERFMON_JOB", script)}
        if wanted not in {paths.safe_job(name) for name in names}:
            continue
        try:
            if "libtorch" not in _read(f"/proc/{pid}/maps"):
                continue
        except OSError:
            continue
        found[pid] = (run_id, env.get("MASTER_ADDR", ""), env.get("MASTER_PORT", "")) if "RANK" in env else (str(pid),)
    ranks = [pid for pid in found if not _has_ancestor_in(pid, found)]
    if not ranks:
        raise UserError(f"no process of job {job} on this node (a Python process with torch loaded, running "
                        f"{job}.py or `-m ...{job}`); give its PID instead")
    jobs: dict[tuple[str, ...], list[int]] = {}
    for pid in sorted(ranks):
        jobs.setdefault(found[pid], []).append(pid)
    if len(jobs) > 1:
        listed = "; ".join(", ".join(map(str, pids)) for pids in jobs.values())
        raise UserError(f"{len(jobs)} jobs named {job} run on this node (processes {listed}): give the PID of one "
                        "(or its torchrun launcher's)")
    return sorted(ranks)


def _has_ancestor_in(pid: int, pids: dict[int, object]) -> bool:
    parent, hops = _parent(pid), 0
    while parent > 1 and hops < 64:
        if parent in pids:
            return True
        parent, hops = _parent(parent), hops + 1
    return False


def _paths() -> list[str]:
    """Where the target finds perfmon's probe and the probe's dependencies: this installation."""
    found = [str(Path(target_side.__file__).resolve().parents[1])]
    for name in target_side.DEPENDENCIES:
        spec = importlib.util.find_spec(name)
        if spec is None or not (spec.submodule_search_locations or spec.origin):
            raise UserError(f"perfmon's installation lacks {name}; reinstall perfmon")
        where = next(iter(spec.submodule_search_locations)) if spec.submodule_search_locations else spec.origin
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
        reach: float = ANSWER_SECONDS) -> dict:
    """Run ``action`` ("inject" or "detach") in the target by its method; its answer (``ok``,
    ``message``, ...). ``job``: the name the injected probe serves the job under. ``reach``: how
    long the target's main thread may take to reach a safe point (remote-exec)."""
    if target.method == "ptrace":
        _need_hypno(target.pid)
    directory: str | None = _answer_dir(target.pid)
    try:
        result = os.path.join(directory, "answer.json")
        paths = _paths()
        if target.method == "remote-exec":
            wanted = os.path.join(directory, WANTED)
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
        _enter(target.pid, entry_thread(target.pid), target_side.payload(action, paths, result, job))
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
        sys.remote_exec(pid, entry)
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


def chosen(args: Any) -> list[int]:
    """The processes ``perfmon inject`` / ``detach`` act on here: ``--job NAME``'s, else the PID's
    (a torchrun launcher's workers)."""
    if (args.pid is None) == (args.job is None):
        raise UserError("give a PID or --job NAME (one of them)")
    return job_processes(args.job) if args.job is not None else workers(args.pid)


def across_hosts(args: Any) -> tuple[list[str], str] | None:
    """The hosts ``--hosts``/``--hostfile``/``--slurm``/``--k8s`` name and the transport to them,
    for a job across nodes; None when none is named (this node)."""
    from tui.stream import hosts

    found = hosts.choose_hosts(args.hosts, args.hostfile, args.slurm, args.k8s, args.namespace)
    if found is None:
        if args.via is not None:
            raise UserError("--via goes with --hosts, --hostfile, --slurm or --k8s")
        return None
    if args.pid is not None or args.job is None:
        raise UserError("a PID is a process of one node: name the job on those hosts with --job NAME")
    return found, hosts.transport(args.via, args.k8s, args.namespace)


def on_hosts(action: str, job: str, found: list[str], via: str, timeout: float, method: str = "auto") -> list[Any]:
    """``perfmon ACTION --job JOB`` on every host at once through the transport (``tui.stream.hosts``);
    each host's ``HostRun``."""
    from tui.stream.hosts import run_on_hosts

    command = ["perfmon", action, "--job", job]
    if action == "inject":
        command[2:2] = ["--timeout", f"{timeout:g}"]
    if method != "auto":
        command[2:2] = ["--method", method]
    return run_on_hosts(found, via, command, timeout + ENTER_SECONDS + ANSWER_SECONDS)


def relay_output(action: str, results: list[Any]) -> None:
    """What the hosts said, line by line under each host's name (their ``perfmon ACTION: `` taken off)."""
    for result in results:
        for line in result.out.splitlines():
            print(f"{result.host}: {line}", flush=True)
        for line in result.err.splitlines():
            print(f"perfmon {action}: {result.host}: {line.removeprefix(f'perfmon {action}: ')}", file=sys.stderr,
                  flush=True)


def host_failures(action: str, results: list[Any]) -> str:
    """One line naming each host that failed and why ('' when none did)."""
    return "; ".join(f"{r.host}: {r.problem().removeprefix(f'perfmon {action}: ')}" for r in results if r.code != 0)
