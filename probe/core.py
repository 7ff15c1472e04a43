"""The in-process probe: the hot path, its lifecycle, and fork safety.

The hot path (``loader``, ``step``, ``phase``) reads ``perf_counter`` and
appends a tuple to a bounded deque; nothing else. Building records, packing,
sending and recording happen on the sender thread (``probe.server``), slow
numbers on the sampler thread (``probe.sampler``). ``start()`` never raises:
anything that fails leaves a probe that still works for whatever did not.
"""

from __future__ import annotations

import atexit
import collections
import os
import socket
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from probe import paths, wire
from probe.recording import RecordingWriter
from probe.sampler import Sampler
from probe.server import Sender

QUEUE_ITEMS = 65_536   # hot-path buffer; at 200 B a step this bounds it near 13 MB
CPU_TIMED_WAIT = 50e-6  # a loader wait above this (s) switches on main-thread CPU timing (data_cpu) ...
CPU_TIMED_BATCHES = 64  # ... for this many batches
_STEP = 0
_REC = 1

_lock = threading.Lock()
_current: "Probe | None" = None


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


class _Phase:
    """Reusable context manager for one phase name (no allocation per use)."""

    __slots__ = ("probe", "name", "t0")

    def __init__(self, probe: "Probe", name: str) -> None:
        self.probe = probe
        self.name = name
        self.t0 = 0.0

    def __enter__(self) -> "_Phase":
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, et: Any, ev: Any, tb: Any) -> bool:
        phases = self.probe._phases
        phases[self.name] = phases.get(self.name, 0.0) + (time.perf_counter() - self.t0)
        return False


class _Step:
    """Reusable context manager for ``Probe.step()``."""

    __slots__ = ("probe", "samples", "tokens", "flops")

    def __init__(self, probe: "Probe") -> None:
        self.probe = probe
        self.samples: float | None = None
        self.tokens: float | None = None
        self.flops: float | None = None

    def __enter__(self) -> "_Step":
        p = self.probe
        t = time.perf_counter()
        if p._prev_end is None:
            p._prev_end = t
        p._gap = t - p._prev_end - p._data   # between steps, outside the loader wait
        if p._begin_hooks:
            p._run_hooks(p._begin_hooks)
        return self

    def __exit__(self, et: Any, ev: Any, tb: Any) -> bool:
        p = self.probe
        t = time.perf_counter()
        extras: dict[str, Any] | None = None
        if p._end_hooks:
            extras = {}
            p._run_hooks(p._end_hooks, extras)
        if et is not None:
            p._on_step_exception(et, ev)
        phases = p._phases
        p._phases = {}
        data = p._data
        p._data = 0.0
        data_cpu = p._data_cpu
        p._data_cpu = None
        p._q.append((_STEP, p._step_no, p._prev_end, t, data, phases, self.samples, self.tokens, self.flops, extras,
                     p._gap, data_cpu))
        p._step_no += 1
        p._prev_end = t
        return False


class Probe:
    """One per process. Use ``probe.start()`` rather than constructing it."""

    def __init__(self, *, job: str, rank: int, local_rank: int, world_size: int, restart: int,
                 record: str | os.PathLike | None, serve: bool, sample_hz: float) -> None:
        self.job = job
        self.rank = rank
        self.local_rank = local_rank
        self.world_size = world_size
        self.restart = restart
        self.pid = os.getpid()
        self.name = paths.base_name(job, rank, restart, self.pid)
        self.socket_path: Path | None = None
        self.token_path: Path | None = None   # PERFMON_TCP: the token viewers must send
        self.record_path: Path | None = None
        self.problems: list[str] = []     # why a part is off, one line each
        self.closed = False
        # hot-path state
        self._q: collections.deque = collections.deque(maxlen=QUEUE_ITEMS)
        self._phases: dict[str, float] = {}
        self._data = 0.0
        self._data_cpu: float | None = None   # main-thread CPU s in loader waits (single-process loaders)
        self._gap = 0.0
        self._step_no = 0
        self._prev_end: float | None = None
        self._phase_ctx: dict[str, _Phase] = {}
        self._step_ctx = _Step(self)
        self._begin_hooks: list[Callable[..., Any]] = []
        self._end_hooks: list[Callable[..., Any]] = []
        self._hook_errors = 0
        self._epoch = time.time() - time.perf_counter()  # perf_counter -> unix seconds
        self.first_batch_wait: float | None = None
        self.loader_iterators: list[weakref.ref] = []    # for worker discovery (sampler side)
        self.extra_sources: list[Any] = []               # sampler sources added by device extensions
        self.device: dict[str, Any] = {"type": "cpu", "name": _cpu_name(), "count": os.cpu_count() or 1}
        self.sender: Sender | None = None
        self.sampler: Sampler | None = None
        self._setup(record, serve, sample_hz)

    # -- public API ---------------------------------------------------------------------------
    def loader(self, iterable: Iterable[Any]) -> Iterator[Any]:
        """Yield from ``iterable``, timing how long each ``next()`` blocks (the data stall)."""
        it = iter(iterable)
        self.loader_iterators.append(weakref.ref(it) if _weakrefable(it) else (lambda it=it: it))
        pc = time.perf_counter
        tt = time.thread_time
        t0 = pc()
        c0 = tt()
        try:
            first = next(it)
        except StopIteration:
            return
        dt = pc() - t0
        self.first_batch_wait = dt
        self._q.append((_REC, {"k": "event", "t": time.time(), "name": "first_batch", "seconds": dt}))
        if self._prev_end is not None:
            self._data += dt
        if type(it).__name__ == "_MultiProcessingDataLoaderIter":   # workers load; the sampler watches them
            yield first
            while True:
                t0 = pc()
                try:
                    batch = next(it)
                except StopIteration:
                    return
                self._data += pc() - t0
                yield batch
        # This thread does the loading (num_workers=0, plain iterables): its CPU time inside
        # next() tells CPU-bound preprocessing from waiting on I/O. It is read (two syscalls)
        # for the CPU_TIMED_BATCHES batches after any wait long enough to matter: a loader
        # that never makes the step wait costs nothing extra.
        if self._prev_end is not None:
            self._data_cpu = (self._data_cpu or 0.0) + (tt() - c0)
        timed = CPU_TIMED_BATCHES if dt > CPU_TIMED_WAIT else 0
        yield first
        while True:
            c0 = tt() if timed else None
            t0 = pc()
            try:
                batch = next(it)
            except StopIteration:
                return
            t1 = pc()
            if c0 is not None:
                timed -= 1
                self._data_cpu = (self._data_cpu or 0.0) + (tt() - c0)
            dt = t1 - t0
            self._data += dt
            if dt > CPU_TIMED_WAIT:
                timed = CPU_TIMED_BATCHES
            yield batch

    def step(self, samples: float | None = None, tokens: float | None = None,
             flops: float | None = None) -> _Step:
        """Context manager around one optimizer step."""
        ctx = self._step_ctx
        ctx.samples = samples
        ctx.tokens = tokens
        ctx.flops = flops
        return ctx

    def phase(self, name: str) -> _Phase:
        """Context manager timing a named phase inside the current step."""
        ctx = self._phase_ctx.get(name)
        if ctx is None:
            ctx = self._phase_ctx[name] = _Phase(self, name)
        return ctx

    def event(self, name: str, **fields: Any) -> None:
        """Annotate the stream (checkpoint, eval, custom); never raises."""
        try:
            rec = {"k": "event", "t": time.time(), "name": str(name)}
            rec.update({k: v for k, v in fields.items() if k not in ("k", "t")})
            self._q.append((_REC, rec))
        except Exception:
            pass

    def emit(self, record: dict[str, Any]) -> None:
        """Queue a ready-made record (sampler and instrumentation threads use this)."""
        self._q.append((_REC, record))

    def close(self) -> None:
        """Flush, say ``bye``, close sockets and the recording. Idempotent; bounded to ~2 s."""
        global _current
        if self.closed or os.getpid() != self.pid:
            return
        self.closed = True
        try:
            if self.sampler is not None:
                self.sampler.stop_event.set()
                # sources call into torch (memory walker); a daemon thread inside torch's C++ code
                # while the interpreter finalizes aborts the process ("terminate called ...", exit 134)
                self.sampler.join(1.0)
                if not self.sampler.is_alive():
                    self.sampler.flush()   # last totals (comm) reach the stream before bye
            if self.sender is not None:
                self.sender.stop_event.set()
                self.sender.stopped.wait(2.0)
            for path in (self.socket_path, self.token_path):
                if path is not None:
                    try:
                        os.unlink(path)
                    except OSError:
                        pass
        except Exception:
            pass
        with _lock:
            if _current is self:
                _current = None

    def watch(self, model: Any = None, optimizer: Any = None, **options: Any) -> None:
        """Attach phase hooks, communication timing, memory breakdown and FLOPs (probe.watch).

        Idempotent per model/optimizer; never raises.
        """
        try:
            from probe.watch import watch
            watch(self, model=model, optimizer=optimizer, **options)
        except Exception as exc:
            self._internal_error("watch", exc)

    # -- hooks for instrumentation (watch, zero-code mode) ----------------------------------
    def add_step_hooks(self, begin: Callable[[], None] | None = None,
                       end: Callable[[dict[str, Any]], None] | None = None) -> None:
        """Register callables run at step begin / end; ``end`` fills extra step-record keys."""
        if begin is not None:
            self._begin_hooks = self._begin_hooks + [begin]
        if end is not None:
            self._end_hooks = self._end_hooks + [end]

    def begin_step(self) -> None:
        """Zero-code mode (``probe.auto``): hooks found a step beginning; run the step-begin hooks."""
        if self._begin_hooks:
            self._run_hooks(self._begin_hooks)

    def add_step(self, start: float, end: float, phases: dict[str, float] | None = None,
                 samples: float | None = None, data_cpu: float | None = None) -> None:
        """Queue a step whose boundaries hooks found (``perf_counter`` seconds; zero-code mode).

        Unlike ``step()`` the step's own start is explicit: the time since the previous
        step's end becomes the record's ``gap`` (checkpoints, evaluation: lost time in
        ETTR). ``phases`` (``data`` included) add to those timed with ``phase()``;
        ``data_cpu`` is the training thread's CPU time inside the loader waits.
        """
        extras: dict[str, Any] | None = None
        if self._end_hooks:
            extras = {}
            self._run_hooks(self._end_hooks, extras)
        merged = self._phases
        self._phases = {}
        for name, seconds in (phases or {}).items():
            merged[name] = merged.get(name, 0.0) + seconds
        data = merged.pop("data", 0.0) + self._data
        self._data = 0.0
        if data_cpu is not None or self._data_cpu is not None:
            data_cpu = (data_cpu or 0.0) + (self._data_cpu or 0.0)
        self._data_cpu = None
        prev = self._prev_end if self._prev_end is not None and self._prev_end <= start else start
        self._q.append((_STEP, self._step_no, prev, end, data, merged, samples, None, None, extras, start - prev,
                        data_cpu))
        self._step_no += 1
        self._prev_end = end

    def _run_hooks(self, hooks: list[Callable[..., Any]], *args: Any) -> None:
        for hook in hooks:
            try:
                hook(*args)
            except Exception:
                self._hook_errors += 1

    def _on_step_exception(self, et: Any, ev: Any) -> None:
        name = getattr(et, "__name__", "Exception")
        kind = "oom" if "OutOfMemory" in name or name == "MemoryError" else "exception"
        self._q.append((_REC, {"k": "event", "t": time.time(), "name": kind, "error": name,
                               "message": str(ev)[:300], "step": self._step_no}))

    # -- record building (sender thread) -----------------------------------------------------
    def build(self, item: tuple) -> dict[str, Any] | None:
        if item[0] == _REC:
            return item[1]
        _, step_no, start, end, data, phases, samples, tokens, flops, extras, gap, data_cpu = item
        dur = end - start
        phases = dict(phases)
        if data:
            phases["data"] = data
        known = sum(v for v in phases.values())
        gap = max(0.0, gap)
        phases["other"] = max(0.0, dur - known - gap)   # phases + gap add up to dur
        rec: dict[str, Any] = {"k": "step", "t": end + self._epoch, "step": step_no, "start": start + self._epoch,
                               "dur": dur, "phases": phases, "gap": gap}
        if samples is not None:
            rec["samples"] = samples
        if tokens is not None:
            rec["tokens"] = tokens
        if flops is not None:
            rec["flops"] = flops
        if data_cpu is not None:
            rec["data_cpu"] = data_cpu
        if extras:
            rec.update(extras)
        return rec

    def hello(self) -> dict[str, Any]:
        import platform
        torch_mod = sys.modules.get("torch")
        return {"k": "hello", "t": time.time(), "proto": list(wire.PROTO), "job": self.job, "rank": self.rank,
                "local_rank": self.local_rank, "world_size": self.world_size, "host": platform.node(),
                "pid": self.pid, "restart": self.restart, "argv": [str(a)[:200] for a in sys.argv[:32]],
                "torch": getattr(torch_mod, "__version__", None), "device": self.device, "name": self.name,
                "python": platform.python_version()}

    # -- setup ------------------------------------------------------------------------------
    def _setup(self, record: str | os.PathLike | None, serve: bool, sample_hz: float) -> None:
        listener = None
        recorder = None
        tcp_listener, tcp_token = None, None
        if serve:
            try:
                listener = self._listen()
            except (paths.UnsafeDirectory, OSError) as exc:
                self._problem(f"live view off: {exc}")
            if os.environ.get("PERFMON_TCP"):
                try:
                    tcp_listener, tcp_token = self._listen_tcp(os.environ["PERFMON_TCP"])
                except (paths.UnsafeDirectory, OSError, ValueError) as exc:
                    self._problem(f"TCP view off: {exc}")
        if record:
            try:
                rec_dir = Path(record)
                rec_dir.mkdir(parents=True, exist_ok=True)
                self.record_path = rec_dir / f"{self.name}{paths.RECORD_SUFFIX}"
                recorder = RecordingWriter(self.record_path)
            except OSError as exc:
                self.record_path = None
                self._problem(f"recording off: cannot write {record}: {exc.strerror or exc}")
        for extend in _device_extensions:
            try:
                extend(self)
            except Exception as exc:
                self._problem(f"device detection failed: {exc!r}")
        self.sender = Sender(queue=self._q, build=self.build, hello=self.hello(), listener=listener,
                             tcp_listener=tcp_listener, tcp_token=tcp_token,
                             recorder=recorder, on_error=self._internal_error)
        self.sender.start()
        sources = []
        try:
            from probe.host import HostSource
            sources.append(HostSource())
        except Exception as exc:
            self._problem(f"host sampling off: {exc!r}")
        try:
            from probe.loader_workers import LoaderWorkersSource
            sources.append(LoaderWorkersSource(self))
        except Exception as exc:
            self._problem(f"loader worker sampling off: {exc!r}")
        sources.extend(self.extra_sources)
        self.sampler = Sampler(sources, self.emit, hz=sample_hz)
        self.sampler.start()
        _register_fork_handler(self)
        atexit.register(self.close)

    def _listen(self) -> socket.socket:
        directory = paths.ensure_dir()
        path = directory / f"{self.name}{paths.SOCKET_SUFFIX}"
        _remove_stale(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            sock.bind(str(path))
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        sock.listen(16)
        self.socket_path = path
        return sock

    def _listen_tcp(self, spec: str) -> tuple[socket.socket, str]:
        """``PERFMON_TCP=[host:]port``: listen (127.0.0.1 unless told), token in a 0600 file by the socket."""
        import secrets
        host, _, port = spec.rpartition(":")
        if not port.isdigit():
            raise ValueError(f"PERFMON_TCP={spec!r} is not [host:]port")
        directory = paths.ensure_dir()
        token = secrets.token_urlsafe(24)
        token_path = directory / f"{self.name}.token"
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
        self.token_path = token_path
        return sock, token

    def _problem(self, message: str) -> None:
        self.problems.append(message)
        try:
            sys.stderr.write(f"perfmon: {message}\n")
        except (OSError, ValueError):
            pass

    def _internal_error(self, where: str, exc: BaseException) -> None:
        """The probe's own failures become events in the stream, not output per step."""
        try:
            self._q.append((_REC, {"k": "event", "t": time.time(), "name": "warning",
                                   "message": f"perfmon {where} error: {exc!r}"[:300]}))
        except Exception:
            pass

    def _after_fork_in_child(self) -> None:
        """Forked child (DataLoader worker): go silent; close inherited fds; touch no locks."""
        self.closed = True
        self._q = collections.deque(maxlen=0)
        self._begin_hooks = []
        self._end_hooks = []
        if self.sender is not None:
            self.sender.abandon()


# Instrumentation modules (GPU, watch) register here to fill ``Probe.device`` before hello.
_device_extensions: list[Callable[[Probe], None]] = []


def _attach_gpu(probe: Probe) -> None:
    from probe.gpu import attach
    attach(probe)


_device_extensions.append(_attach_gpu)

_fork_registered = False
_probes: "weakref.WeakSet[Probe]" = weakref.WeakSet()


def _register_fork_handler(probe: Probe) -> None:
    global _fork_registered
    _probes.add(probe)
    if not _fork_registered and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_on_fork_child)
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


def _remove_stale(path: Path) -> None:
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


def _weakrefable(obj: Any) -> bool:
    try:
        weakref.ref(obj)
        return True
    except TypeError:
        return False


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or "CPU"


class _Disabled:
    """Same API, does nothing: returned in DataLoader workers or when PERFMON_DISABLE is set."""

    closed = True
    socket_path = None
    record_path = None
    problems: list[str] = []

    def loader(self, iterable: Iterable[Any]) -> Iterator[Any]:
        return iter(iterable)

    def step(self, **_: Any) -> "_Null":
        return _NULL

    def phase(self, name: str) -> "_Null":
        return _NULL

    def event(self, name: str, **fields: Any) -> None:
        pass

    def emit(self, record: dict[str, Any]) -> None:
        pass

    def add_step_hooks(self, *a: Any, **k: Any) -> None:
        pass

    def watch(self, *a: Any, **k: Any) -> None:
        pass

    def begin_step(self) -> None:
        pass

    def add_step(self, *a: Any, **k: Any) -> None:
        pass

    def close(self) -> None:
        pass


class _Null:
    def __enter__(self) -> "_Null":
        return self

    def __exit__(self, *exc: Any) -> bool:
        return False


_NULL = _Null()


def start(job: str | None = None, *, record: str | os.PathLike | None = None, rank: int | None = None,
          world_size: int | None = None, serve: bool = True, sample_hz: float | None = None) -> Probe | _Disabled:
    """Start (or return) this process's probe. Idempotent; ``PERFMON_*`` env vars override; never raises."""
    global _current
    try:
        if os.environ.get("PERFMON_DISABLE") == "1" or _in_dataloader_worker():
            return _Disabled()
        with _lock:
            if _current is not None and not _current.closed and _current.pid == os.getpid():
                return _current
            job = os.environ.get("PERFMON_JOB") or job or _default_job()
            record = os.environ.get("PERFMON_RECORD") or record
            hz = sample_hz if sample_hz is not None else float(os.environ.get("PERFMON_SAMPLE_HZ") or 1.0)
            _current = Probe(
                job=job,
                rank=rank if rank is not None else _env_int("RANK", "PERFMON_RANK"),
                local_rank=_env_int("LOCAL_RANK", default=0),
                world_size=world_size if world_size is not None else _env_int("WORLD_SIZE", default=1),
                restart=_env_int("TORCHELASTIC_RESTART_COUNT", default=0),
                record=record, serve=serve, sample_hz=hz)
            return _current
    except Exception as exc:  # never into training code
        try:
            sys.stderr.write(f"perfmon: probe disabled: {exc!r}\n")
        except (OSError, ValueError):
            pass
        return _Disabled()


def current() -> Probe | None:
    return _current


def _default_job() -> str:
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    script = Path(sys.argv[0]).stem if sys.argv and sys.argv[0] not in ("", "-c") else "python"
    if run_id and run_id != "none":
        return f"{script}-{run_id}"
    return script
