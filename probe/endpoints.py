"""The probe's listening endpoints: the per-user Unix socket and the optional TCP port with its token."""

from __future__ import annotations

import os
import secrets
import socket
from pathlib import Path

from probe import paths

SUN_PATH_MAX = 107      # sockaddr_un's sun_path is 108 bytes on Linux, its last a NUL


def unix_path(name: str, directory: Path | None = None) -> Path:
    """``<socket dir>/<name>.sock``; OSError when it is longer than a Unix socket's address takes."""
    path = (directory or paths.socket_dir()) / f"{name}{paths.SOCKET_SUFFIX}"
    if len(os.fsencode(path)) > SUN_PATH_MAX:
        raise OSError(f"the socket path {path} is {len(os.fsencode(path))} bytes, over the {SUN_PATH_MAX} a Unix "
                      "socket takes: set PERFMON_DIR to a shorter directory")
    return path


def listen_unix(name: str) -> tuple[socket.socket, Path]:
    """Bind ``<socket dir>/<name>.sock`` (0600, in a 0700 per-user directory) and listen."""
    path = unix_path(name, paths.ensure_dir())
    remove_stale(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(16)
    return sock, path


def listen_tcp(name: str, spec: str) -> tuple[socket.socket, str, Path]:
    """``PERFMON_TCP=[host:]port``: listen (127.0.0.1 unless told), token in a 0600 file by the socket."""
    host, _, port = spec.rpartition(":")
    if not port.isdigit():
        raise ValueError(f"PERFMON_TCP={spec!r} is not [host:]port")
    directory = paths.ensure_dir()
    token = secrets.token_urlsafe(24)
    token_path = paths.token_path(directory, name)
    fd = os.open(token_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(token + "\n")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host or "127.0.0.1", int(port)))
        sock.listen(8)
    except OSError:
        sock.close()
        os.unlink(token_path)
        raise
    return sock, token, token_path


def remove_stale(path: Path) -> None:
    """Remove a socket file nobody answers on (a crashed run's leftover)."""
    if not path.exists():
        return
    probe_sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe_sock.settimeout(0.2)
        probe_sock.connect(str(path))
    except OSError:
        try:
            os.unlink(path)
        except OSError:
            pass
    finally:
        probe_sock.close()


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or "CPU"
