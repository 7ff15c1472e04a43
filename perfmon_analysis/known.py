"""Statistics over values that may be unknown (None): unknown is never 0, so a reduction over
nothing known is unknown too (docs/verdict.md, "Unknown is unknown")."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")


def known(reduce: Callable[[list[T]], R], values: Iterable[T | None]) -> R | None:
    """``reduce`` over the known values; None when none is known (unknown is never 0)."""
    known = [v for v in values if v is not None]
    return reduce(known) if known else None


def sum_known(values: Iterable[float | None]) -> float | None:
    return known(sum, values)


def mean_known(values: Iterable[float | None]) -> float | None:
    return known(statistics.fmean, values)


def max_known(values: Iterable[Any]) -> Any:
    return known(max, values)


def min_known(values: Iterable[float | None]) -> float | None:
    return known(min, values)



def per_item(power: float | None, rate: float | None) -> float | None:
    """Joules per item: watts over items per second (unknown when either is, or nothing was done)."""
    return power / rate if power is not None and rate else None


def sum_all(values: list[float | None]) -> float | None:
    """The sum when every value is known: a job's energy is unknown while one rank's is."""
    return sum(v for v in values if v is not None) if values and None not in values else None


