"""Where sockets live, what they are called, and whether the directory is safe.

The rules follow tmux's private socket directory: one directory per user, 0700,
owned by us, not a symlink; anything else is refused with the reason, because a
directory someone else controls lets them read or impersonate the stream.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

SOCKET_SUFFIX = ".sock"
RECORD_SUFFIX = ".pmrec"
TOKEN_SUFFIX = ".token"   # PERFMON_TCP: <name>.token beside the socket, mode 0600; viewers read it
_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_NAME = re.compile(r"^(?P<job>.+)\.r(?P<rank>\d+)\.x(?P<restart>\d+)\.p(?P<pid>\d+)$")
MAX_JOB_CHARS = 48  # keeps socket paths well under the 108-byte sun_path limit


class UnsafeDirectory(Exception):
    """The socket directory cannot be trusted; ``str()`` says why in one line."""


def socket_dir() -> Path:
    """``$PERFMON_DIR``, else ``$XDG_RUNTIME_DIR/perfmon``, else ``/tmp/perfmon-<uid>``."""
    if os.environ.get("PERFMON_DIR"):
        return Path(os.environ["PERFMON_DIR"])
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return Path(runtime) / "perfmon"
    return Path(f"/tmp/perfmon-{os.getuid()}")


def check_dir(path: Path) -> None:
    """Raise UnsafeDirectory unless ``path`` is a real directory, ours, mode 0700 or stricter."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise UnsafeDirectory(f"{path} does not exist") from None
    except PermissionError:
        raise UnsafeDirectory(f"{path} is not accessible (permission denied)") from None
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeDirectory(f"refusing socket directory {path}: it is a symlink")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDirectory(f"refusing socket directory {path}: not a directory")
    if st.st_uid != os.getuid():
        raise UnsafeDirectory(f"refusing socket directory {path}: owned by uid {st.st_uid}, not {os.getuid()}")
    if st.st_mode & 0o077:
        raise UnsafeDirectory(
            f"refusing socket directory {path}: mode {stat.S_IMODE(st.st_mode):o} lets group/others in (need 700)")


def ensure_dir(path: Path | None = None) -> Path:
    """Create the socket directory 0700 if missing, then check it; raise UnsafeDirectory."""
    path = path or socket_dir()
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise UnsafeDirectory(f"cannot create socket directory {path}: {exc.strerror}") from None
    check_dir(path)
    return path


def safe_job(job: str) -> str:
    return (_SAFE.sub("-", job).strip("-.") or "job")[:MAX_JOB_CHARS]


def base_name(job: str, rank: int, restart: int, pid: int) -> str:
    """``<job>.r<rank>.x<restart>.p<pid>``: enough for ls/attach to group ranks of a job."""
    return f"{safe_job(job)}.r{rank}.x{restart}.p{pid}"


def token_path(directory: Path, name: str) -> Path:
    """Where a probe started with ``PERFMON_TCP`` keeps its token: ``<name>.token`` beside its socket."""
    return directory / f"{name}{TOKEN_SUFFIX}"


@dataclass(frozen=True)
class SocketName:
    job: str
    rank: int
    restart: int
    pid: int


def parse_name(name: str) -> SocketName | None:
    """Inverse of ``base_name`` for a file name with or without its suffix."""
    for suffix in (SOCKET_SUFFIX, RECORD_SUFFIX):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    m = _NAME.match(name)
    if not m:
        return None
    return SocketName(m["job"], int(m["rank"]), int(m["restart"]), int(m["pid"]))
