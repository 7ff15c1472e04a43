"""A job's processes on this node, found from ``/proc`` alone: how CPython reads a command line,
the name perfmon gives a process's job by default, a torchrun launcher's workers. ``perfmon
inject``/``detach`` (``tui.injector``) and their ``--job NAME`` act on what these find."""

from __future__ import annotations

import os
import re
from collections.abc import Container
from dataclasses import dataclass
from pathlib import Path

from probe import paths
from tui.errors import UserError


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


LAUNCHERS = ("torch.distributed.run", "torch.distributed.launch", "torchrun")


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


def environ_of(pid: int) -> dict[str, str]:
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
        env = environ_of(pid)
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


def _has_ancestor_in(pid: int, pids: Container[int]) -> bool:
    parent, hops = _parent(pid), 0
    while parent > 1 and hops < 64:
        if parent in pids:
            return True
        parent, hops = _parent(parent), hops + 1
    return False
