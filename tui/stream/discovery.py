"""Finding live jobs: the socket directory scan (listed by ``perfmon ls``), TARGET resolution,
and the TCP form of a target (host:port and its token)."""

from __future__ import annotations

import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from probe import paths
from tui.errors import UserError


@dataclass(frozen=True)
class Endpoint:
    """One live probe (one process, one rank) that a viewer can connect to."""

    job: str
    rank: int
    restart: int
    pid: int
    socket: str
    age_s: float

    def as_json(self) -> dict:
        return asdict(self)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _refuses(path: Path) -> bool:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(0.5)
    try:
        sock.connect(str(path))
    except OSError:
        return True
    finally:
        sock.close()
    return False


def list_endpoints(directory: Path | None = None) -> list[Endpoint]:
    """Live probes of this user on this node; stale sockets found on the way are removed."""
    directory = directory or paths.socket_dir()
    if not os.path.lexists(directory):
        return []
    try:
        paths.check_dir(directory)
    except paths.UnsafeDirectory as exc:
        raise UserError(str(exc)) from None
    now = time.time()
    found: list[Endpoint] = []
    for entry in sorted(directory.iterdir()):
        if not entry.name.endswith(paths.SOCKET_SUFFIX):
            continue
        name = paths.parse_name(entry.name)
        if name is None:
            continue
        if not _alive(name.pid) and _refuses(entry):
            try:
                entry.unlink()
            except OSError:
                pass
            continue
        try:
            age = max(0.0, now - entry.lstat().st_mtime)
        except OSError:
            continue
        found.append(Endpoint(name.job, name.rank, name.restart, name.pid, str(entry), round(age, 1)))
    return found


def latest_generation(endpoints: list[Endpoint]) -> list[Endpoint]:
    """One endpoint per (job, rank): the highest restart count, then the newest process."""
    best: dict[tuple[str, int], Endpoint] = {}
    for ep in endpoints:
        key = (ep.job, ep.rank)
        cur = best.get(key)
        if cur is None or (ep.restart, -ep.age_s) > (cur.restart, -cur.age_s):
            best[key] = ep
    return sorted(best.values(), key=lambda e: (e.job, e.rank))


def jobs(endpoints: list[Endpoint]) -> dict[str, list[Endpoint]]:
    grouped: dict[str, list[Endpoint]] = {}
    for ep in latest_generation(endpoints):
        grouped.setdefault(ep.job, []).append(ep)
    return grouped


def resolve_live(target: str | None) -> list[Endpoint]:
    """TARGET (job name, pid, socket path, or None for the only job) -> the endpoints of one job."""
    endpoints = list_endpoints()
    if target is None:
        grouped = jobs(endpoints)
        if not grouped:
            raise UserError(f"no perfmon job is running for this user here ({paths.socket_dir()}); "
                            "start one with `perfmon run -- python train.py` or `perfmon demo`")
        if len(grouped) > 1:
            raise UserError(f"{len(grouped)} jobs are running ({', '.join(sorted(grouped))}); name one")
        return next(iter(grouped.values()))
    if target.endswith(paths.SOCKET_SUFFIX) or "/" in target:
        path = Path(target)
        try:
            exists = path.exists()
        except PermissionError:          # a directory of another user's on the way
            raise UserError(f"{target}: permission denied (a job of another user?)") from None
        if not exists:
            raise UserError(f"no such socket: {target}")
        name = paths.parse_name(path.name)
        if name is None:
            raise UserError(f"{target} is not a perfmon socket")
        if not os.access(path, os.W_OK):   # connecting needs write permission: say so before anything starts
            raise UserError(f"{target}: permission denied (a job of another user?)")
        return [Endpoint(name.job, name.rank, name.restart, name.pid, str(path), 0.0)]
    if target.isdigit():
        pid = int(target)
        hits = [ep for ep in endpoints if ep.pid == pid]
        if not hits:
            if not _alive(pid):
                raise UserError(f"no process {pid} (has it exited?)")
            raise UserError(f"process {pid} has no perfmon probe: `perfmon inject {pid}` starts one in it "
                            "without a restart (docs/attach.md)")
        return hits
    grouped = jobs(endpoints)
    if target not in grouped:
        known = ", ".join(sorted(grouped)) or "none"
        raise UserError(f"no job named {target!r} is running (live jobs: {known})")
    return grouped[target]


# -- tokens ----------------------------------------------------------------------------------

def read_token(explicit: str | None, directory: Path | None = None) -> str:
    """The TCP token: ``--token``, else ``PERFMON_TOKEN``, else the only ``*.token`` file here."""
    if explicit:
        return explicit
    if os.environ.get("PERFMON_TOKEN"):
        return os.environ["PERFMON_TOKEN"]
    directory = directory or paths.socket_dir()
    try:
        files = sorted(directory.glob(f"*{paths.TOKEN_SUFFIX}"))
    except OSError:
        files = []
    if len(files) == 1:
        try:
            return files[0].read_text().strip()
        except OSError as exc:
            raise UserError(f"cannot read {files[0]}: {exc.strerror or exc}") from None
    where = "no token file" if not files else f"{len(files)} token files"
    raise UserError(f"host:port needs the probe's token ({where} in {directory}); "
                    "pass --token TOKEN or set PERFMON_TOKEN (the job writes it to <job>.token beside its socket)")


def parse_host_port(target: str) -> tuple[str, int] | None:
    """'host:port' or ':port' -> (host, port); None if TARGET is not of that form."""
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit() or "/" in target:
        return None
    number = int(port)
    if not 0 < number < 65536:
        raise UserError(f"{target}: port must be 1..65535")
    return (host.strip("[]") or "127.0.0.1"), number

