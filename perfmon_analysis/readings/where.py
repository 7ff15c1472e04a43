"""``where`` records: the training thread's stack samples per user line and state."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from perfmon_analysis.readings.base import _int, _text, num


@dataclass(frozen=True)
class WhereCount:
    """One line of a ``where`` interval: the user's source line (the innermost frame outside the
    stdlib, site-packages and perfmon), the library call below it, and the in-step stack samples
    that found the training thread there in ``state`` ("waiting": off CPU, "busy": on CPU, None:
    the probe could read neither its CPU clock nor its scheduler statistics)."""

    file: str
    line: int
    function: str
    call: str | None
    lib: str | None
    state: str | None
    n: int


@dataclass(frozen=True)
class WhereInterval:
    """One ``where`` record: the training thread's in-step stack samples over [t0, t1]."""

    t0: float
    t1: float
    hz: float | None
    samples: int
    lines: tuple[WhereCount, ...]
    other: int
    runq: float | None = None    # share of the sampled in-step time the thread was runnable, waiting for a core


WHERE_STATES = ("waiting", "busy")


def where_interval(rec: dict[str, Any]) -> WhereInterval | None:
    """A ``where`` record, or None when its interval or sample count is missing (nothing to add up)."""
    t0, t1, samples = num(rec.get("t0")), num(rec.get("t1")), _int(rec.get("samples"))
    if t0 is None or t1 is None or samples is None or samples < 0:
        return None
    lines = []
    for item in rec.get("lines") if isinstance(rec.get("lines"), list) else []:
        if not isinstance(item, dict):
            continue
        file, function, line, n = _text(item.get("file")), _text(item.get("function")), _int(item.get("line")), \
            _int(item.get("n"))
        state = item.get("state")
        if file is None or line is None or n is None or n <= 0 or (state is not None and state not in WHERE_STATES):
            continue
        lines.append(WhereCount(file=file, line=line, function=function or "?", call=_text(item.get("call")),
                                lib=_text(item.get("lib")), state=state, n=n))
    runq = num(rec.get("runq"))
    return WhereInterval(t0=t0, t1=t1, hz=num(rec.get("hz")), samples=samples, lines=tuple(lines),
                         other=max(0, _int(rec.get("other")) or 0),
                         runq=None if runq is None else max(0.0, min(1.0, runq)))
