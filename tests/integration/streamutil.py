"""Test helpers: read a probe's stream as a plain client would."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import msgpack

from probe import wire

JOBS = Path(__file__).parent / "jobs"


def connect(path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(path))
    return sock


def read_until(sock: socket.socket, done: Callable[[list[dict]], bool], timeout: float = 20.0) -> list[dict]:
    """Decode frames with the project's decoder until ``done(records)`` or EOF; fail on timeout."""
    dec = wire.FrameDecoder()
    records: list[dict] = []
    deadline = time.monotonic() + timeout
    sock.settimeout(0.2)
    while not done(records):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s with {len(records)} records")
        try:
            data = sock.recv(1 << 16)
        except TimeoutError:
            continue
        if not data:
            break
        records.extend(dec.feed(data))
    return records


def step_seen(last: int) -> Callable[[list[dict]], bool]:
    """A ``read_until`` condition that looks only at records it has not seen yet (a full rescan per recv is
    quadratic)."""
    scanned = 0

    def done(records: list[dict]) -> bool:
        nonlocal scanned
        new, scanned = records[scanned:], len(records)
        return any(r["k"] == "step" and r["step"] == last for r in new)

    return done


def raw_read_all(sock: socket.socket, timeout: float = 30.0) -> list[dict]:
    """Follow the documented frame format by hand (u32 BE length + msgpack map) until EOF."""
    sock.settimeout(timeout)
    buf = b""
    out = []
    while True:
        data = sock.recv(1 << 16)
        if not data:
            return out
        buf += data
        while len(buf) >= 4:
            (n,) = struct.unpack(">I", buf[:4])
            if len(buf) < 4 + n:
                break
            out.append(msgpack.unpackb(buf[4:4 + n], raw=False))
            buf = buf[4 + n:]


def wait_for(cond: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def start_job(*args: str, env: dict | None = None) -> tuple[subprocess.Popen, str]:
    """Start jobs/api_job.py; return the process and its socket path (first stdout line)."""
    proc = subprocess.Popen([sys.executable, str(JOBS / "api_job.py"), *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})
    path = proc.stdout.readline().strip()
    assert path and path != "None", proc.stderr.read()
    return proc, path



def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL a launcher and every process under it: torchrun's workers are in process groups of
    their own, so killing the launcher's group would orphan them."""
    import psutil
    try:
        root = psutil.Process(proc.pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        procs = []
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=30)
    proc.wait(30)


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


# what CPython keeps of the compiled parts of the probe's dependencies: an extension module cannot be
# unloaded, and msgpack's keeps the exception and ext classes it imported (the same few, however many cycles)
KEPT_BY_EXTENSIONS = ("module .msgpack._cmsgpack", "module .psutil._psutil_linux", "msgpack.ext.",
                      "msgpack.exceptions.")
STAYS_IMPORTED = ("pynvml",)      # probe.inject.STAYS_IMPORTED: ctypes would keep its classes anyway


def left_by_perfmon(end: dict) -> dict:
    """What tests/integration/scripts/inject_target.py found left at its end that a probe could have
    left: its ``residue`` (threads, fds, hooks, wrapped functions, sys.path, meta_path, perfmon objects,
    perfmon's modules, functions and classes alive), less what CPython itself keeps of compiled
    extensions (``KEPT_BY_EXTENSIONS``), pynvml (left imported on purpose), and the modules a probe
    imports that are not perfmon's or its dependencies' (they stay imported, as after any import)."""
    residue = dict(end["residue"])
    modules = residue.pop("modules", {"before": [], "after": []})
    ours = sorted(name for name in set(modules["after"]) - set(modules["before"])
                  if name.split(".")[0] in ("probe", "msgpack", "psutil", "tui", "perfmon_analysis"))
    code = residue.pop("perfmon_code", {"before": [], "after": []})
    alive = sorted(set(code["after"]) - set(code["before"]))
    alive = [name for name in alive if not any(kept in name for kept in KEPT_BY_EXTENSIONS)
             and name.split()[-1].lstrip(".").split(".")[0] not in STAYS_IMPORTED]
    return {**residue, **({"modules": ours} if ours else {}), **({"perfmon_code": alive} if alive else {})}
