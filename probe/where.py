"""Where the iteration goes: a low-rate sampler of the training thread's Python stack, inside steps
and between them.

Time the probe does not hook (a call to a service, a lock, a tokenizer, ``.item()``, metrics
logging after the optimizer step) would otherwise read as compute or as an unexplained gap. A
daemon thread wakes at ``PERFMON_WHERE_HZ`` (default ``DEFAULT_HZ``, each period jittered by ±50%
so a periodic loop cannot alias with it; 0 turns it off) and, once the training loop has begun,
takes one sample of the training thread, saying which span it fell in: ``step`` (inside a step:
the probe's step, or in zero-code mode the time after the batch fetch that opens the next one) or
``between`` (after a step's end, before the next begins, outside the batch fetch: the loop's own
work between steps and its pauses), and for the latter whether it was before the step's lines in
the loop (preparing the next step's input) or after them (``LoopLines``). A sample in the batch fetch
between steps is not taken: the data wait is timed by the loader hooks. Between-step samples are held
until the next step begins, so the time after the last step (the script's own end) is never counted as the loop's:

* the user's line: the innermost frame whose file is not in the standard library,
  site-packages/dist-packages or perfmon's own packages (else the innermost frame), and the
  innermost library frame below it (``lib``, "module.qualname"), folded under that line;
* the state over the ``WINDOW_S`` after the sample: "busy" when the training thread was on
  CPU, or runnable and waiting for a core (Linux schedstat: a loaded machine does not turn
  compute into waiting), for at least half of it; else "waiting" (off CPU: sleeping, blocked on
  I/O, a lock, a service, the GIL). Without schedstat, the thread's CPU clock
  (``time.pthread_getcpuclockid``) alone; where neither can be read, no state (unknown).

While the training thread waits, the process's other Python threads' CPU clocks are read over the
same window: when one was on CPU for at least half of it and this thread itself woke from the
window a tenth of a switch interval late or more (the GIL was held in Python, not released by native
code), that thread is named (its name, user line and function) as the holder of the GIL the
training thread waits for (``holders``; docs/verdict.md, "The GIL's holder").

A sample is a Python-level look, so it needs the GIL: while the training thread runs Python
(holding it) the look waits up to the switch interval (5 ms) for it, or until the thread
releases it in a blocking call. Busy Python that ends in a blocking call therefore loses up to
one switch interval of its samples to that call (measured in bench/RESULTS.md); torch ops and
I/O release the GIL, so their samples land where they are taken.

Every ``INTERVAL_S`` with samples taken, one ``where`` record (wire 1.3; ``between`` and ``holders``
1.5) carries that interval's counts: the ``MAX_LINES`` largest (line, state) pairs of each span and
the rest as ``other``. A separate
thread rather than the stall watch's: that one ticks every 0.5 s on purpose (its tests drive
its clock), this one needs a jittered ~50 ms period, is absent when switched off, and a
failure here cannot delay a stall report. One sample costs one ``sys._current_frames()``, a
walk up to the user's frame and two schedstat reads per thread watched (~20 µs of CPU on this
thread with no other Python thread; bench/RESULTS.md).
"""

from __future__ import annotations

import linecache
import os
import random
import sys
import sysconfig
import threading
import time
from collections.abc import Callable
from types import CodeType
from typing import Any

from probe import fetches
from probe.thread_clocks import WAITING, OtherThreads, ThreadClock

DEFAULT_HZ = 19.0       # a prime rate, jittered: no loop period divides it
MAX_HZ = 200.0
INTERVAL_S = 2.0        # a record at most this often, while steps run
MAX_LINES = 20          # lines per record (the largest); the rest is ``other``
MAX_KEYS = 512          # distinct (line, state) per interval; samples past it count as ``other``
MAX_LIBS = 8            # library calls remembered per line (the most frequent is sent)
MAX_DEPTH = 256         # frames walked looking for the user's line
MAX_FILES = 4096        # file classifications remembered
CALL_CHARS = 80
WINDOW_S = 0.004        # the state is read over this window from the sample on: a step's parts are longer

GIL_LATE = 0.1          # this thread woke a tenth of a switch interval late (0.5 ms) or more: the GIL was held

STEP = "step"
BETWEEN = "between"
BEFORE = "before"
AFTER = "after"
STEP_LINE_SHARE = 0.25  # a function's step lines: those with this share of its most sampled line's samples
MAX_STEP_LINES = 64     # lines counted per function
WARM_STEPS = 10         # steps before the loop's lines are counted (warm-up, compilation: other call sites)
SLIP_S = 0.001          # a look this late got the GIL from Python code that held it (the switch interval is 5 ms)

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

    def __init__(self, roots: tuple[str, ...] | None = None, fetch_codes: frozenset[Any] = frozenset()) -> None:
        self.roots = roots if roots is not None else library_roots()
        self.fetch_codes = fetch_codes     # code objects of the loader wrappers: a frame of one is a batch fetch
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
    """One interval's samples of one span, by (file, line, function, state); bounded by ``MAX_KEYS``."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0                  # unix s
        self.samples = 0
        self.other = 0
        self.lines: dict[tuple[str, int, str, str | None], list[Any]] = {}   # key -> [n, {lib: n}, before, after]

    def add(self, frame: Any, state: str | None, places: Places) -> None:
        """Count one sample of a stack whose innermost frame is ``frame``."""
        self.count(place(frame, places), state)

    def count(self, where_: tuple[str, int, str, str | None], state: str | None, n: int = 1,
              libs: dict[str | None, int] | None = None, before: int = 0, after: int = 0) -> None:
        """Count ``n`` samples at ``where_`` (``place()``) in ``state`` (``libs``: their library calls;
        ``before``/``after``: how many were taken before or after the step's lines in the loop, ``LoopLines``)."""
        filename, lineno, function, lib = where_
        key = (filename, lineno, function, state)
        self.samples += n
        entry = self.lines.get(key)
        if entry is None:
            if len(self.lines) >= MAX_KEYS:
                self.other += n
                return
            entry = self.lines[key] = [0, {}, 0, 0]
        entry[0] += n
        entry[2] += before
        entry[3] += after
        known = entry[1]
        for name, k in (libs or {lib: n}).items():
            if name in known or len(known) < MAX_LIBS:
                known[name] = known.get(name, 0) + k

    def merge(self, other: Tally) -> None:
        """Add ``other``'s counts (a gap's samples, once the next step began)."""
        for (filename, lineno, function, state), (n, libs, before, after) in other.lines.items():
            self.count((filename, lineno, function, None), state, n, libs, before, after)
        self.samples += other.other
        self.other += other.other

    def listed(self) -> list[dict[str, Any]]:
        """The ``MAX_LINES`` largest lines as the wire lists them."""
        ranked = sorted(self.lines.items(), key=lambda kv: -kv[1][0])
        lines = []
        for (filename, lineno, function, state), (n, libs, before, after) in ranked[:MAX_LINES]:
            line: dict[str, Any] = {"file": filename, "line": lineno, "function": function, "n": n}
            if before:
                line["before"] = before
            if after:
                line["after"] = after
            call = source_line(filename, lineno)
            if call:
                line["call"] = call
            lib = max(libs.items(), key=lambda kv: kv[1])[0] if libs else None
            if lib is not None:
                line["lib"] = lib
            if state is not None:
                line["state"] = state
            lines.append(line)
        return lines

    def record(self, t1: float, hz: float) -> dict[str, Any]:
        """The ``where`` record of this interval: the ``MAX_LINES`` largest lines, the rest as ``other``."""
        lines = self.listed()
        listed = sum(line["n"] for line in lines)
        return {"k": "where", "t": t1, "t0": self.t0, "t1": t1, "hz": hz, "samples": self.samples,
                "lines": lines, "other": self.samples - listed}


class LoopLines:
    """Where a between-step sample is in the training loop: before the step's lines (preparing what the
    next step takes: a batch built by hand, tokenizing) or after them (logging, metrics, a lock after the
    optimizer step). Inside steps, from the ``WARM_STEPS``-th step on (warm-up steps called from other lines
    before the loop do not count), each user function's lines are counted; its step lines are those with
    at least ``STEP_LINE_SHARE`` of the samples of its most sampled line (a line of the step that takes
    little time falls out of them). Between steps, the innermost frame of a function seen in steps whose
    line lies outside its step lines says which: below them is before, above them after. The loop's
    function is that frame (its calls into the step are the step's lines), whether the loop calls the
    model directly or a helper that does; a loop whose lines run out of order (a ``while`` with the batch
    built at its end) reads after, and a function never seen in steps says nothing."""

    def __init__(self, places: Places) -> None:
        self.places = places
        self.lines: dict[Any, dict[int, int]] = {}    # code object -> {line: in-step samples}

    def seen(self, stack: list[tuple[Any, int]]) -> None:
        """Count the lines of the user's frames of an in-step stack (``stack_of``)."""
        known = self.lines
        for code, line in stack:
            if self.places.is_user(code.co_filename):
                counts = known.get(code)
                if counts is None:
                    if len(known) >= MAX_FILES:
                        known.clear()
                    counts = known[code] = {}
                if line in counts or len(counts) < MAX_STEP_LINES:
                    counts[line] = counts.get(line, 0) + 1

    def order(self, stack: list[tuple[Any, int]]) -> str | None:
        """"before" or "after" the step's lines, for a between-step stack (``stack_of``); None when no
        frame says."""
        for code, line in stack:
            counts = self.lines.get(code)
            if counts:
                floor = STEP_LINE_SHARE * max(counts.values())
                steps = [at for at, n in counts.items() if n >= floor]
                if line < min(steps):
                    return BEFORE
                if line > max(steps):
                    return AFTER
        return None


class Holders:
    """Samples in which the training thread waited while another Python thread was on CPU, by that
    thread's name, user line and span; bounded by ``MAX_KEYS``."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str, int, str, str], int] = {}

    def count(self, thread: str, where_: tuple[str, int, str, str | None], span: str) -> None:
        key = (thread, where_[0], where_[1], where_[2], span)
        if key in self.counts or len(self.counts) < MAX_KEYS:
            self.counts[key] = self.counts.get(key, 0) + 1

    def listed(self) -> list[dict[str, Any]]:
        ranked = sorted(self.counts.items(), key=lambda kv: -kv[1])[:MAX_LINES]
        out = []
        for (thread, filename, lineno, function, span), n in ranked:
            item: dict[str, Any] = {"thread": thread, "file": filename, "line": lineno, "function": function,
                                    "span": span, "n": n}
            call = source_line(filename, lineno)
            if call:
                item["call"] = call
            out.append(item)
        return out


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
    return code.co_filename, user.f_lineno or 0, _function(user), None if user is innermost else _qualified(innermost)


def _function(frame: Any) -> str:
    """The frame's function; a generator expression or comprehension is named by the function it is in
    (``encode_forever``, not ``<genexpr>``), as the user wrote it."""
    name = frame.f_code.co_name
    back = frame.f_back
    while name in _NESTED and back is not None and back.f_code.co_filename == frame.f_code.co_filename:
        name, back = back.f_code.co_name, back.f_back
    return name


_NESTED = frozenset({"<genexpr>", "<listcomp>", "<dictcomp>", "<setcomp>"})


def stack_of(frame: Any) -> list[tuple[Any, int]]:
    """(code object, line) of each frame of a stack, the innermost first (at most ``MAX_DEPTH``): read
    once, at the look, so nothing walks another thread's frames after it may have moved on."""
    out: list[tuple[CodeType, int]] = []
    while frame is not None and len(out) < MAX_DEPTH:
        out.append((frame.f_code, frame.f_lineno or 0))
        frame = frame.f_back
    return out


def in_fetch(stack: list[tuple[Any, int]], codes: frozenset[Any]) -> bool:
    """Is a batch fetch (a frame of one of ``codes``, ``fetch_codes()``) anywhere on the stack? A user's
    ``Dataset.__getitem__`` can be the innermost user frame of a fetch, so the whole stack is looked at."""
    return any(code in codes for code, _ in stack)


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


def fetch_codes() -> frozenset[Any]:
    """The code objects whose frames mean "fetching a batch": the DataLoader iterator's wrapper (zero-code
    mode, the trainer callbacks) and ``Probe.loader`` (API)."""
    codes: set[Any] = {fetches._wrap_next(None).__code__}
    core = sys.modules.get("probe.core")
    if core is not None:
        codes.add(core.Probe.loader.__code__)
    return frozenset(codes)


class WhereSampler(threading.Thread):
    """The sampling thread of one probe; ``tick`` is one look (tests call it directly).

    ``probe.progress()`` says whether the training thread is inside a step; ``probe.opening`` (zero-code
    mode, when set) whether a batch fetch has opened the next step already (the step's time runs from it)."""

    def __init__(self, probe: Any, emit: Callable[[dict[str, Any]], None], hz: float,
                 places: Places | None = None) -> None:
        super().__init__(name="perfmon-where", daemon=True)
        self.probe = probe
        self.emit = emit
        self.hz = hz
        self.places = places or Places(fetch_codes=fetch_codes())
        self.clock = ThreadClock()
        self.others = OtherThreads()
        self.loop = LoopLines(self.places)
        self.stop_event = threading.Event()
        self.tally = Tally(time.time())          # in-step samples of the interval
        self.between = Tally(self.tally.t0)      # between-step samples of gaps that ended in the interval
        self.pending = Tally(self.tally.t0)      # between-step samples of the gap in course
        self.pending_holders: list[tuple[str, tuple[str, int, str, str | None]]] = []
        self.pending_after = -1                  # the step count the gap in course follows
        self.holders = Holders()
        self._rng = random.Random()

    def run(self) -> None:
        period = 1.0 / self.hz
        while True:
            wait = period * self._rng.uniform(0.5, 1.5)
            due = time.perf_counter() + wait
            if self.stop_event.wait(wait):
                break
            try:
                self.tick(due)
            except Exception as exc:   # never let the thread die; the next tick tries again
                self.probe.report_error("where sampler", exc)
        try:
            self.flush()
        except Exception as exc:
            self.probe.report_error("where sampler", exc)

    def tick(self, due: float | None = None) -> dict[str, Any] | None:
        """One look: a sample when the training loop has begun; the interval's record when
        ``INTERVAL_S`` has passed (returned, and emitted). ``due``: when the look was meant to be
        (``perf_counter``); a look that got the GIL ``SLIP_S`` later, after a step had ended, is left
        out: the stack is past the step's end, the time it stands for was the step's."""
        steps, span, thread_id = self._where_now()
        if self.pending.samples and (steps != self.pending_after or span == STEP):
            self._gap_ended()
        if span is not None and thread_id is not None and not self._slipped(due):
            self._sample(thread_id, span, steps)
        if time.time() - self.tally.t0 >= INTERVAL_S:
            return self.flush()
        return None

    def _slipped(self, due: float | None) -> bool:
        """Did the look wait for the GIL past a step's end (``tick``)?"""
        if due is None or time.perf_counter() - due < SLIP_S:
            return False
        ended = self.probe.progress()[1]
        return ended is not None and ended > due

    def _where_now(self) -> tuple[int, str | None, int | None]:
        """(steps so far, the span the training thread is in, its id)."""
        steps, _, in_step, thread_id, _ = self.probe.progress()
        opening = getattr(self.probe, "opening", None)
        span = STEP if in_step or (opening is not None and opening()) else BETWEEN if steps > 0 else None
        return steps, span, thread_id

    def _sample(self, thread_id: int, span: str, steps: int) -> None:
        clock = self.clock
        frames = sys._current_frames()
        frame = frames.get(thread_id)
        # the stack as soon as this thread holds the GIL: a thread running Python gives it up only
        # every switch interval (5 ms), so a second wait for it would land samples later still; read at
        # once, before any call that could let the thread move on
        at = place(frame, self.places) if frame is not None else None
        stack = stack_of(frame)
        del frame, frames
        # the look may have waited for the GIL while the thread crossed a step's boundary: such a stack is
        # of neither span for sure, and one in the wrong span would put a gap's line among the step's
        if self._where_now() != (steps, span, thread_id):
            return
        order = None
        if span == STEP:
            if steps >= WARM_STEPS:
                self.loop.seen(stack)
        else:
            if in_fetch(stack, self.places.fetch_codes):   # the data wait: timed by the loader hooks, not the loop's
                return
            order = self.loop.order(stack)
        self.others.refresh(thread_id)
        others = self.others.cpu() if self.others.readers else {}
        clock.state(thread_id, at is not None)
        t0 = time.perf_counter()
        self.stop_event.wait(WINDOW_S)     # the state: the thread's over this window, from the sample on
        late = time.perf_counter() - t0 - WINDOW_S
        state = clock.state(thread_id, False, count=span)
        if at is None or (state is None and clock.known):
            return
        holder = None
        # a thread running Python keeps the GIL until the switch interval asks for it: this thread, waking
        # from its wait, is late by about that interval; a thread on CPU in native code that released the
        # GIL makes no one late, and is not named
        if state == WAITING and others and late >= GIL_LATE * sys.getswitchinterval():
            busiest = self.others.busiest(others, time.perf_counter() - t0)
            # its stack now, still running: one taken before the window may have returned since (a
            # generator's frame then loses the function it ran in)
            frame = sys._current_frames().get(busiest[0]) if busiest is not None else None
            if frame is not None and busiest is not None:
                holder = (busiest[1], place(frame, self.places))
            del frame
        if span == STEP:
            self.tally.count(at, state)
            if holder is not None:
                self.holders.count(holder[0], holder[1], STEP)
        else:
            self.pending.count(at, state, before=int(order == BEFORE), after=int(order == AFTER))
            self.pending_after = steps
            if holder is not None and len(self.pending_holders) < MAX_KEYS:
                self.pending_holders.append(holder)

    def _gap_ended(self) -> None:
        """The next step began: the gap's samples are the loop's, counted in the interval."""
        if self.pending.samples:
            self.between.merge(self.pending)
            for thread, at in self.pending_holders:
                self.holders.count(thread, at, BETWEEN)
        self.pending = Tally(self.pending.t0)
        self.pending_holders = []

    def flush(self) -> dict[str, Any] | None:
        """Send the interval's counts (nothing when no sample was taken) and start a new interval."""
        tally, between, holders, now = self.tally, self.between, self.holders, time.time()
        runq, between_runq = self.clock.runq_share(STEP), self.clock.runq_share(BETWEEN)
        self.tally, self.between, self.holders = Tally(now), Tally(now), Holders()
        if not tally.samples and not between.samples:
            return None
        record = tally.record(now, self.hz)
        if runq is not None:
            record["runq"] = runq
        if between.samples:
            lines = between.listed()
            record["between"] = lines
            record["between_samples"] = between.samples
            record["between_other"] = between.samples - sum(line["n"] for line in lines)
            if between_runq is not None:
                record["between_runq"] = between_runq
        if holders.counts:
            record["holders"] = holders.listed()
        self.emit(record)
        return record
