"""A bounded quantile sketch of durations: the whole run's step-time percentiles in constant memory.

The DDSketch construction (Masson, Rim, Lee, "DDSketch: a fast and fully-mergeable quantile sketch
with relative-error guarantees", VLDB 2019): logarithmic buckets whose width grows with the value,
so any quantile is read within ``SKETCH_ACCURACY`` of a true value, however many values were added.
"""

from __future__ import annotations

import math

SKETCH_ACCURACY = 0.01     # relative error of a quantile read
_GAMMA = (1 + SKETCH_ACCURACY) / (1 - SKETCH_ACCURACY)
_LOG_GAMMA = math.log(_GAMMA)
_TINY = 1e-7               # durations below this (100 ns) share the lowest bucket


class DurationSketch:
    """Counts of durations in logarithmic buckets: bucket ``i`` holds (gamma^(i-1), gamma^i], so any
    quantile is read within ``SKETCH_ACCURACY`` of a true value. From 100 ns to a day that is at
    most ~1,400 buckets, however many steps are added; the maximum is kept exactly, with its step."""

    __slots__ = ("counts", "n", "max", "max_step")

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.n = 0
        self.max = 0.0
        self.max_step: int | None = None

    def add(self, seconds: float, step: int | None = None) -> None:
        i = math.ceil(math.log(max(seconds, _TINY)) / _LOG_GAMMA)
        self.counts[i] = self.counts.get(i, 0) + 1
        self.n += 1
        if seconds > self.max or self.max_step is None:
            self.max, self.max_step = seconds, step

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile (nearest rank), None when empty; the top quantile is the exact max."""
        if not self.n:
            return None
        rank = q * (self.n - 1)
        seen = 0
        for i in sorted(self.counts):
            seen += self.counts[i]
            if seen > rank:
                return min(self.max, 2 * _GAMMA ** i / (_GAMMA + 1))
        return self.max
