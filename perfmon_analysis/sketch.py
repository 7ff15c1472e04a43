"""Bounded quantile sketches: the whole run's step-time percentiles in constant memory, and the
group relays' reductions, which merge across groups (docs/tree.md).

The DDSketch construction (Masson, Rim, Lee, "DDSketch: a fast and fully-mergeable quantile sketch
with relative-error guarantees", VLDB 2019): logarithmic buckets whose width grows with the value,
so any quantile is read within ``SKETCH_ACCURACY`` of a true value, however many values were added,
and two sketches merge by adding their counts. Written here because its wire form must be a plain
msgpack map; the ddsketch package serialises to protobuf only.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, TypeGuard

SKETCH_ACCURACY = 0.01      # relative error of any quantile (DDSketch's alpha): 1% of the value
SKETCH_MIN = 1e-6           # values at or below this count in the zero bucket (a share of 0, no wait)


class Sketch:
    """A mergeable quantile sketch with relative accuracy ``SKETCH_ACCURACY`` (DDSketch: Masson,
    Rim and Lee, VLDB 2019): value x > 0 counts in bucket ceil(log_gamma x). Written here because
    its wire form must be a plain msgpack map; the ddsketch package serialises to protobuf only."""

    GAMMA = (1 + SKETCH_ACCURACY) / (1 - SKETCH_ACCURACY)
    _LOG = math.log(GAMMA)

    def __init__(self) -> None:
        self.bins: Counter[int] = Counter()
        self.zero = 0

    @property
    def count(self) -> int:
        return self.zero + sum(self.bins.values())

    def add(self, x: float) -> None:
        if x <= SKETCH_MIN:
            self.zero += 1
        else:
            self.bins[math.ceil(math.log(x) / self._LOG)] += 1

    def merge(self, other: Sketch) -> None:
        self.zero += other.zero
        self.bins.update(other.bins)

    def quantile(self, q: float) -> float | None:
        """The q-quantile (0..1), within the sketch's relative accuracy; None when empty."""
        n = self.count
        if n == 0:
            return None
        rank = q * (n - 1)
        seen = self.zero
        if rank < seen:
            return 0.0
        for index in sorted(self.bins):
            seen += self.bins[index]
            if rank < seen:
                return 2 * self.GAMMA ** index / (self.GAMMA + 1)
        return 2 * self.GAMMA ** max(self.bins) / (self.GAMMA + 1)

    def wire(self) -> dict[str, Any]:
        flat: list[int] = []
        for index in sorted(self.bins):
            flat += [index, self.bins[index]]
        return {"z": self.zero, "b": flat}

    @classmethod
    def read(cls, obj: Any) -> Sketch:
        """A sketch from its wire form; what is malformed counts as nothing."""
        sketch = cls()
        if not isinstance(obj, dict):
            return sketch
        zero, flat = obj.get("z"), obj.get("b")
        sketch.zero = zero if is_count(zero) else 0
        if isinstance(flat, list) and len(flat) % 2 == 0:
            for index, n in zip(flat[::2], flat[1::2]):
                if isinstance(index, int) and not isinstance(index, bool) and is_count(n) and abs(index) < 100_000:
                    sketch.bins[index] += n
        return sketch


class DurationSketch(Sketch):
    """Step times: a ``Sketch`` that also keeps the longest one exactly, with its step number, and
    reads its top quantile as that maximum (from 1 µs to a day, at most ~1,400 buckets)."""

    def __init__(self) -> None:
        super().__init__()
        self.max = 0.0
        self.max_step: int | None = None

    @property
    def n(self) -> int:
        return self.count

    def add(self, seconds: float, step: int | None = None) -> None:
        super().add(seconds)
        if seconds > self.max or self.max_step is None:
            self.max, self.max_step = seconds, step

    def quantile(self, q: float) -> float | None:
        value = super().quantile(q)
        return None if value is None else min(self.max, value)


def is_count(x: Any) -> TypeGuard[int]:
    """A whole number of things (no bool), as a wire form's counts must be."""
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0
