"""Where the steps go: a low-rate sampler of the training thread's Python stack inside steps.

Time the probe does not hook (a call to a service, a lock, a tokenizer, ``.item()``) would
otherwise read as compute. A daemon thread wakes at ``PERFMON_WHERE_HZ`` (default
``DEFAULT_HZ``, each period jittered by ±50% so a periodic loop cannot alias with it; 0 turns
it off) and, while the training thread is inside a step, takes one sample:

* the user's line: the innermost frame whose file is not in the standard library,
  site-packages/dist-packages or perfmon's own packages (else the innermost frame), and the
  innermost library frame below it (``lib``, "module.qualname"), folded under that line;
* the state over the ``WINDOW_S`` after the sample: "busy" when the training thread was on
  CPU, or runnable and waiting for a core (Linux schedstat: a loaded machine does not turn
  compute into waiting), for at least half of it; else "waiting" (off CPU: sleeping, blocked on
  I/O, a lock, a service, the GIL). Without schedstat, the thread's CPU clock
  (``time.pthread_getcpuclockid``) alone; where neither can be read, no state (unknown).

A sample is a Python-level look, so it needs the GIL: while the training thread runs Python
(holding it) the look waits up to the switch interval (5 ms) for it, or until the thread
releases it in a blocking call. Busy Python that ends in a blocking call therefore loses up to
one switch interval of its samples to that call (measured in bench/RESULTS.md); torch ops and
I/O release the GIL, so their samples land where they are taken.

Every ``INTERVAL_S`` with samples taken, one ``where`` record (wire 1.3) carries that interval's
counts: the ``MAX_LINES`` largest (line, state) pairs and the rest as ``other``. A separate
thread rather than the stall watch's: that one ticks every 0.5 s on purpose (its tests drive
its clock), this one needs a jittered ~50 ms period, is absent when switched off, and a
failure here cannot delay a stall report. One sample costs one ``sys._current_frames()``, a
walk up to the user's frame and two schedstat reads (~20 µs of CPU on this thread).
"""

from __future__ import annotations

import linecache
import os
import random
import sys
import sysconfig
import threading
import time
from typing import Any, Callable

DEFAULT_HZ = 19.0       # a prime rate, jittered: no loop period divides it
MAX_HZ = 200.0
INTERVAL_S = 2.0        # a record at most this often, while steps run
MAX_LINES = 20          # lines per record (the largest); the rest is ``other``
MAX_KEYS = 512          # distinct (line, state) per interval; samples past it count as ``other``
MAX_LIBS = 8            # library calls remembered per line (the most frequent is sent)
MAX_DEPTH = 256         # frames walked looking for the user's line
MAX_FILES = 4096        # file classifications remembered
CALL_CHARS = 80
BUSY_SHARE = 0.5        # CPU time over wall time at or above which a sample is "busy"
WINDOW_S = 0.004        # the state is read over this window from the sample on: a step's parts are longer

BUSY = "busy"
WAITING = "waiting"

_PROBE_DIR = os.path.dirname(os.path.abspath(__file__))
_OWN_DIRS = (_PROBE_DIR, os.path.join(os.path.dirname(_PROBE_DIR), "tui"))   # perfmon's packages


def sampling_hz() -> float:
    """``PERFMON_WHERE_HZ`` (0 = off, capped at ``MAX_HZ``), else ``DEFAULT_HZ``."""
    try:
        value = float(os.environ.get("PERFMON_WHERE_HZ", DEFAULT_HZ))
    except ValueError:
        return DEFAULT_HZ
    if value != value or value < 0:   # NaN or negative: the default
        return DEFAULT_HZ
    return min(value, MAX_HZ)


def library_roots() -> tuple[str, ...]:
    """Directories whose files are not the user's: the standard library, installed packages, perfmon."""
    paths = sysconfig.get_paths()
    roots = {os.path.abspath(paths[key]) for key in ("stdlib", "platstdlib", "purelib", "platlib") if paths.get(key)}
    roots.update(_OWN_DIRS)
    return tuple(sorted(root.rstrip(os.sep) + os.sep for root in roots))


class Places:
    """Whether a code object's file is the user's; answers remembered per file (bounded)."""

    def __init__(self, roots: tuple[str, ...] | None = None) -> None:
        self.roots = roots if roots is not None else library_roots()
        self._known: dict[str, bool] = {}

    def is_user(self, filename: str) -> bool:
        known = self._known.get(filename)
        if known is None:
            if len(self._known) >= MAX_FILES:
                self._known.clear()
            known = self._known[filename] = self._classify(filename)
        return known

    def _classify(self, filename: str) -> bool:
        if filename.startswith("<frozen"):
            return False
        if filename.startswith("<"):          # <string>, <stdin>: code the user gave
            return True
        path = os.path.abspath(filename)
        if f"{os.sep}site-packages{os.sep}" in path or f"{os.sep}dist-packages{os.sep}" in path:
            return False
        return not path.startswith(self.roots)


class Tally:
    """One interval's samples, by (file, line, function, state); bounded by ``MAX_KEYS``."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0                  # unix s
        self.samples = 0
        self.other = 0
        self.lines: dict[tuple[str, int, str, str | None], list[Any]] = {}   # key -> [n, {lib: n}]

    def add(self, frame: Any, state: str | None, places: Places) -> None:
        """Count one sample of a stack whose innermost frame is ``frame``."""
        self.count(place(frame, places), state)

    def count(self, where_: tuple[str, int, str, str | None], state: str | None) -> None:
        """Count one sample at ``where_`` (``place()``) in ``state``."""
        filename, lineno, function, lib = where_
        key = (filename, lineno, function, state)
        self.samples += 1
        entry = self.lines.get(key)
        if entry is None:
            if len(self.lines) >= MAX_KEYS:
                self.other += 1
                return
            entry = self.lines[key] = [0, {}]
        entry[0] += 1
        libs = entry[1]
        if lib in libs or len(libs) < MAX_LIBS:
            libs[lib] = libs.get(lib, 0) + 1

    def record(self, t1: float, hz: float) -> dict[str, Any]:
        """The ``where`` record of this interval: the ``MAX_LINES`` largest lines, the rest as ``other``."""
        ranked = sorted(self.lines.items(), key=lambda kv: -kv[1][0])
        lines = []
        for (filename, lineno, function, state), (n, libs) in ranked[:MAX_LINES]:
            line: dict[str, Any] = {"file": filename, "line": lineno, "function": function, "n": n}
            call = source_line(filename, lineno)
            if call:
                line["call"] = call
            lib = max(libs.items(), key=lambda kv: kv[1])[0] if libs else None
            if lib is not None:
                line["lib"] = lib
            if state is not None:
                line["state"] = state
            lines.append(line)
        listed = sum(line["n"] for line in lines)
        return {"k": "where", "t": t1, "t0": self.t0, "t1": t1, "hz": hz, "samples": self.samples,
                "lines": lines, "other": self.samples - listed}


def place(frame: Any, places: Places) -> tuple[str, int, str, str | None]:
    """(file, line, function) of the user's line in the stack whose innermost frame is ``frame``,
    and the innermost library call below it ("module.qualname"; None when that line is innermost)."""
    innermost = frame
    user = None
    depth = 0
    while frame is not None and depth < MAX_DEPTH:
        if places.is_user(frame.f_code.co_filename):
            user = frame
            break
        frame = frame.f_back
        depth += 1
    if user is None:
        user = innermost
    code = user.f_code
    return code.co_filename, user.f_lineno or 0, code.co_name, None if user is innermost else _qualified(innermost)


def _qualified(frame: Any) -> str:
    module = frame.f_globals.get("__name__") or "?"
    code = frame.f_code
    return f"{module}.{getattr(code, 'co_qualname', code.co_name)}"


def source_line(filename: str, lineno: int) -> str | None:
    try:
        text = linecache.getline(filename, lineno).strip()
    except Exception:   # an unreadable file or a loader that fails: no source text
        return None
    return text[:CALL_CHARS] or None


class ThreadClock:
    """Another thread's time on CPU and, where Linux's schedstat is readable, waiting on a run
    queue (runnable, no core free), read from this thread.

    A thread that wants a core but waits for one (more runnable threads than cores) is busy,
    not waiting: counting its run-queue delay keeps a loaded machine from turning compute into
    "waiting". Without schedstat, the thread's CPU clock (``pthread_getcpuclockid``) alone."""

    def __init__(self) -> None:
        self.thread_id: int | None = None
        self.read: Callable[[], tuple[float, float | None]] | None = None   # -> (cpu s, run-queue s | None)
        self.last: tuple[float, float, float | None] | None = None        # (wall, cpu, runq) at the previous look
        self.runq_s = 0.0           # run-queue seconds in the looks ``state(..., count=True)`` summed
        self.wall_s = 0.0           # wall seconds of those looks (0: none, or no schedstat)

    def state(self, thread_id: int, alive: bool, count: bool = False) -> str | None:
        """"busy" or "waiting" over the time since the previous look (the first: None); None when not known.
        ``count``: add this look's run-queue and wall time to ``runq_s``/``wall_s``."""
        if thread_id != self.thread_id:
            self.thread_id, self.read, self.last = thread_id, None, None
        if self.read is None:
            if not alive:     # only for a live thread: its id names a thread that exists
                return None
            self.read = _reader(thread_id)
            if self.read is None:
                return None
        wall = time.perf_counter()
        try:
            cpu, runq = self.read()
        except (OSError, ValueError, IndexError):   # the thread ended
            self.read, self.last = None, None
            return None
        last, self.last = self.last, (wall, cpu, runq)
        if last is None or wall <= last[0]:
            return None
        span = wall - last[0]
        wanted = cpu - last[1]
        if runq is not None and last[2] is not None:
            wanted += runq - last[2]
            if count:
                self.runq_s += runq - last[2]
                self.wall_s += span
        return BUSY if wanted >= BUSY_SHARE * span else WAITING

    @property
    def known(self) -> bool:
        return self.read is not None


def _reader(thread_id: int) -> Callable[[], tuple[float, float | None]] | None:
    native = next((t.native_id for t in threading.enumerate() if t.ident == thread_id), None)
    path = f"/proc/self/task/{native}/schedstat" if native is not None else None
    if path is not None and os.path.exists(path):
        def schedstat() -> tuple[float, float | None]:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                fields = os.read(fd, 128).split()
            finally:
                os.close(fd)
            return int(fields[0]) * 1e-9, int(fields[1]) * 1e-9   # ns on CPU, ns runnable on a run queue
        return schedstat
    if not hasattr(time, "pthread_getcpuclockid"):
        return None
    try:
        clock = time.pthread_getcpuclockid(thread_id)
    except (OSError, OverflowError):
        return None
    return lambda: (time.clock_gettime(clock), None)


class WhereSampler(threading.Thread):
    """The sampling thread of one probe; ``tick`` is one look (tests call it directly)."""

    def __init__(self, probe: Any, emit: Callable[[dict[str, Any]], None], hz: float,
                 places: Places | None = None) -> None:
        super().__init__(name="perfmon-where", daemon=True)
        self.probe = probe
        self.emit = emit
        self.hz = hz
        self.places = places or Places()
        self.clock = ThreadClock()
        self.stop_event = threading.Event()
        self.tally = Tally(time.time())
        self._rng = random.Random()

    def run(self) -> None:
        period = 1.0 / self.hz
        while not self.stop_event.wait(period * self._rng.uniform(0.5, 1.5)):
            try:
                self.tick()
            except Exception as exc:   # never let the thread die; the next tick tries again
                self.probe.report_error("where sampler", exc)
        try:
            self.flush()
        except Exception as exc:
            self.probe.report_error("where sampler", exc)

    def tick(self) -> dict[str, Any] | None:
        """One look: a sample when the training thread is inside a step; the interval's record
        when ``INTERVAL_S`` has passed (returned, and emitted)."""
        _, _, in_step, thread_id, _ = self.probe.progress()
        if in_step and thread_id is not None:
            clock = self.clock
            frame = sys._current_frames().get(thread_id)
            # the stack as soon as this thread holds the GIL: a thread running Python gives it up only
            # every switch interval (5 ms), so a second wait for it would land samples later still
            at = place(frame, self.places) if frame is not None else None
            del frame
            clock.state(thread_id, at is not None)
            self.stop_event.wait(WINDOW_S)     # the state: the thread's over this window, from the sample on
            state = clock.state(thread_id, False, count=True)
            if at is not None and (state is not None or not clock.known):
                self.tally.count(at, state)
        if time.time() - self.tally.t0 >= INTERVAL_S:
            return self.flush()
        return None

    def flush(self) -> dict[str, Any] | None:
        """Send the interval's counts (nothing when no sample was taken) and start a new interval."""
        tally, now = self.tally, time.time()
        clock = self.clock
        runq = clock.runq_s / clock.wall_s if clock.wall_s > 0 else None
        self.tally, clock.runq_s, clock.wall_s = Tally(now), 0.0, 0.0
        if not tally.samples:
            return None
        record = tally.record(now, self.hz)
        if runq is not None:
            record["runq"] = min(1.0, max(0.0, runq))
        self.emit(record)
        return record
