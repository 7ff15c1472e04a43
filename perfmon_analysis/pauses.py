"""In-loop work or a pause: which part of the time between two steps recurs with the loop, and which
is an occasional pause (docs/verdict.md, "Between steps").

Time between steps that recurs on (nearly) every step (tokenizing, building a batch by hand, logging,
pushing metrics, a lock) is the loop's own cost: a loss like any other. ETTR keeps the meaning its
sources give it (seed 001, Meta's effective training time ratio): the share of time lost to occasional
pauses (checkpoints, evaluation, restarts, stalls). They are told apart by how often and how regularly
they recur:

* the loop's level is the median of the previous ``HISTORY`` steps' gaps: time that at least half the
  steps have between them;
* a gap is a pause by the part of it over that level, when that part is at least twice the level
  (``OVER_LOOP``: the gap is three times the usual, so work that varies around its level, a lock
  held for a while by another thread, stays the loop's) and at least half a usual iteration
  (``OVER_ITERATION``: the median step, its gap included), and when no more than ``RECENT_MAX`` of
  the last ``RECENT`` gaps (this one included) were far over the level by at least ``COMPARABLE``
  of this one's part over it: long gaps of its kind on more steps than that are the loop's work too
  (a wait that takes many steps, work the loop began doing, whose level the median has not caught up
  with yet), while far shorter ones do not make it recur (a loaded machine's scheduling delays of a
  few ms around a sub-ms loop do not turn a 300 ms evaluation into the loop's work); else the whole
  gap is the loop's;
* time a blocking event (``checkpoint``, ``eval``, ...: ``buffers.BLOCKING_EVENTS``) says the loop spent
  before the step is a pause whatever its size;
* until ``MIN_HISTORY`` gaps are known, only those events make pauses.

So a checkpoint every 4 steps or fewer is a pause, and so is one every 100; work between every two
steps is the loop's, and so is a long gap on 3 or more of 8 steps. Pure and per rank: ``StepParser``
classifies each step as it is parsed, so the run model, its running totals (ETTR) and the trace export
agree on every pause.
"""

from __future__ import annotations

import bisect
import collections

HISTORY = 49          # gaps the loop's level is the median of: a window's worth (buffers.WINDOW_STEPS - 1)
MIN_HISTORY = 4       # fewer known gaps: no level yet
OVER_LOOP = 2.0       # a pause is at least twice the level over it ...
OVER_ITERATION = 0.5  # ... and at least half a usual iteration ...
RECENT = 8            # ... on no more than RECENT_MAX of the last RECENT gaps
RECENT_MAX = 2
COMPARABLE = 0.25     # ... counting those over the level by at least this share of its own part over it


class Pauses:
    """One rank's recent gaps and step durations, sorted for their medians (O(log n) inserts)."""

    __slots__ = ("_gaps", "_durs", "_order", "_over")

    def __init__(self) -> None:
        self._gaps: list[float] = []
        self._durs: list[float] = []
        self._order: collections.deque[tuple[float, float]] = collections.deque()
        # the last gaps' part far over the level (0: not far)
        self._over: collections.deque[float] = collections.deque(maxlen=RECENT)

    def pause(self, gap: float, dur: float, marked: float = 0.0) -> float:
        """The pause in a step's ``gap`` (s; the rest is the loop's) of a step lasting ``dur`` (its gap
        included); ``marked``: seconds blocking events say were lost before it. Then remembers the step."""
        pause = 0.0
        if len(self._order) >= MIN_HISTORY:
            level = _median(self._gaps)
            over = gap - level
            far = over > 0 and over >= OVER_LOOP * level and over >= OVER_ITERATION * _median(self._durs)
            self._over.append(over if far else 0.0)
            if far and sum(1 for o in self._over if o >= COMPARABLE * over) <= RECENT_MAX:
                pause = over
        self._remember(gap, dur)
        return min(gap, max(pause, marked))

    def _remember(self, gap: float, dur: float) -> None:
        if len(self._order) >= HISTORY:
            old_gap, old_dur = self._order.popleft()
            del self._gaps[bisect.bisect_left(self._gaps, old_gap)]
            del self._durs[bisect.bisect_left(self._durs, old_dur)]
        self._order.append((gap, dur))
        bisect.insort(self._gaps, gap)
        bisect.insort(self._durs, dur)


def _median(values: list[float]) -> float:
    n = len(values)
    mid = n // 2
    return values[mid] if n % 2 else 0.5 * (values[mid - 1] + values[mid])
