"""This process's one probe: ``start()`` makes it (idempotent, never raises), ``current()`` finds
it, and a forked child (a DataLoader worker) forgets it. ``probe.core`` holds the probe itself."""

from __future__ import annotations

import os
import sys
import threading
import weakref
from pathlib import Path

from probe import endpoints, forks, paths
from probe.core import Probe
from probe.disabled import _Disabled

__all__ = ["current", "start"]

_lock = threading.Lock()
_current: Probe | None = None


def _env_int(*names: str, default: int = 0) -> int:
    for name in names:
        value = os.environ.get(name)
        if value is not None and value.strip().lstrip("-").isdigit():
            return int(value)
    return default


def _in_dataloader_worker() -> bool:
    data_mod = sys.modules.get("torch.utils.data")
    if data_mod is None:
        return False
    try:
        return data_mod.get_worker_info() is not None
    except Exception:
        return False


_fork_registered = False
_probes: weakref.WeakSet[Probe] = weakref.WeakSet()


def _track(probe: Probe) -> None:
    global _fork_registered
    _probes.add(probe)
    if not _fork_registered:
        forks.after_in_child(_on_fork_child)
        _fork_registered = True


def _on_fork_child() -> None:
    global _current, _lock
    _lock = threading.Lock()   # a lock held by another thread at fork time stays held in the child
    _current = None
    for probe in list(_probes):
        try:
            probe._after_fork_in_child()
        except Exception:
            pass


def start(job: str | None = None, *, record: str | os.PathLike | None = None, rank: int | None = None,
          world_size: int | None = None, serve: bool = True, sample_hz: float | None = None) -> Probe | _Disabled:
    """Start (or return) this process's probe. Idempotent; ``PERFMON_*`` env vars override; never raises."""
    global _current
    try:
        if os.environ.get("PERFMON_DISABLE") == "1" or _in_dataloader_worker():
            return _Disabled()
        with _lock:
            found = current()
            if found is not None:
                return found
            job = _job(job)
            record = os.environ.get("PERFMON_RECORD") or record
            hz = sample_hz if sample_hz is not None else float(os.environ.get("PERFMON_SAMPLE_HZ") or 1.0)
            probe = Probe(
                job=job,
                rank=rank if rank is not None else _env_rank(),
                local_rank=_env_int("LOCAL_RANK", default=0),
                world_size=world_size if world_size is not None else _env_int("WORLD_SIZE", default=1),
                restart=_env_restart(),
                record=record, serve=serve, sample_hz=hz)
            _track(probe)
            _current = probe
            return probe
    except Exception as exc:  # never into training code
        try:
            sys.stderr.write(f"perfmon: probe disabled: {exc!r}\n")
        except (OSError, ValueError):
            pass
        return _Disabled()


def socket_path(job: str | None = None) -> Path:
    """The socket ``start(job)`` will serve in this process (the job, rank and restart as ``start``
    reads them, the rank from the environment); OSError when it is too long for a Unix socket, which
    ``perfmon inject`` says at once instead of waiting for a socket that cannot appear."""
    return endpoints.unix_path(paths.base_name(_job(job), _env_rank(), _env_restart(), os.getpid()))


def _job(job: str | None) -> str:
    return os.environ.get("PERFMON_JOB") or job or _default_job()


def _env_rank() -> int:
    return _env_int("RANK", "PERFMON_RANK")


def _env_restart() -> int:
    return _env_int("TORCHELASTIC_RESTART_COUNT", default=0)


def current() -> Probe | None:
    """This process's probe, None before ``start()`` or after its ``close()``."""
    probe = _current
    return probe if probe is not None and not probe.closed and probe.pid == os.getpid() else None


def _default_job() -> str:
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    script = Path(sys.argv[0]).stem if sys.argv and sys.argv[0] not in ("", "-c") else "python"
    if run_id and run_id != "none":
        return f"{script}-{run_id}"
    return script
