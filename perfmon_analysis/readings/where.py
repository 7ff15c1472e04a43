"""``where`` records: the training thread's stack samples per user line, state and span (inside a step,
or between steps: wire 1.5), and the other threads seen holding the GIL while it waited."""

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
    span: str = "step"      # "step": inside a step | "between": after a step's end, before the next one
    before: int = 0         # between steps: samples taken before the lines the loop runs its step from
    after: int = 0          # ... and after them (probe.where.LoopLines)


@dataclass(frozen=True)
class HolderCount:
    """Samples in which the training thread waited while another Python thread of the process (``thread``,
    by name) was on CPU holding the GIL, at that thread's user line, in ``span``."""

    thread: str
    file: str
    line: int
    function: str
    call: str | None
    span: str
    n: int


@dataclass(frozen=True)
class WhereInterval:
    """One ``where`` record: the training thread's stack samples over [t0, t1], in-step (``samples``,
    ``lines``) and between steps (``between_samples``, ``between``)."""

    t0: float
    t1: float
    hz: float | None
    samples: int
    lines: tuple[WhereCount, ...]
    other: int
    runq: float | None = None    # share of the sampled in-step time the thread was runnable, waiting for a core
    between_samples: int = 0
    between: tuple[WhereCount, ...] = ()
    holders: tuple[HolderCount, ...] = ()
    between_runq: float | None = None    # as ``runq``, over the between-step samples


WHERE_STATES = ("waiting", "busy")
SPANS = ("step", "between")


def where_interval(rec: dict[str, Any]) -> WhereInterval | None:
    """A ``where`` record, or None when its interval or sample count is missing (nothing to add up)."""
    t0, t1, samples = num(rec.get("t0")), num(rec.get("t1")), _int(rec.get("samples"))
    if t0 is None or t1 is None or samples is None or samples < 0:
        return None
    runq, between_runq = num(rec.get("runq")), num(rec.get("between_runq"))
    between = max(0, _int(rec.get("between_samples")) or 0)
    return WhereInterval(t0=t0, t1=t1, hz=num(rec.get("hz")), samples=samples, lines=_counts(rec.get("lines"), "step"),
                         other=max(0, _int(rec.get("other")) or 0),
                         runq=None if runq is None else max(0.0, min(1.0, runq)), between_samples=between,
                         between=_counts(rec.get("between"), "between") if between else (),
                         holders=_holders(rec.get("holders")),
                         between_runq=None if between_runq is None else max(0.0, min(1.0, between_runq)))


def _counts(items: Any, span: str) -> tuple[WhereCount, ...]:
    """A record's lines of one span; malformed ones are left out."""
    lines = []
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        file, function, line, n = _text(item.get("file")), _text(item.get("function")), _int(item.get("line")), \
            _int(item.get("n"))
        state = item.get("state")
        if file is None or line is None or n is None or n <= 0 or (state is not None and state not in WHERE_STATES):
            continue
        before, after = (max(0, min(n, _int(item.get(key)) or 0)) for key in ("before", "after"))
        lines.append(WhereCount(file=file, line=line, function=function or "?", call=_text(item.get("call")),
                                lib=_text(item.get("lib")), state=state, n=n, span=span, before=before, after=after))
    return tuple(lines)


def _holders(items: Any) -> tuple[HolderCount, ...]:
    out = []
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        file, line, n, span = _text(item.get("file")), _int(item.get("line")), _int(item.get("n")), item.get("span")
        if file is None or line is None or n is None or n <= 0 or span not in SPANS:
            continue
        out.append(HolderCount(thread=_text(item.get("thread")) or "?", file=file, line=line,
                               function=_text(item.get("function")) or "?", call=_text(item.get("call")),
                               span=span, n=n))
    return tuple(out)
