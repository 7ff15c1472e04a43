"""The verdict's parts for the run beyond its window (docs/verdict.md): the crash that ends the story
(outcome ``crashed``, before every question), memory that grows every step (the memory question's
leak test, the memory outcome's leak headline and the ``memory_growth`` finding), and steps far above
the median (the ``step_outliers`` finding). The numbers come from ``JobView.health``
(``perfmon_analysis.health``); the fixes from ``perfmon_analysis.advice``."""

from __future__ import annotations

from typing import Any

from perfmon_analysis import units
from perfmon_analysis.advice import memory_fixes
from perfmon_analysis.crash import Crash
from perfmon_analysis.flowchart import Answer, Explained, Losses, Outcome, round4
from perfmon_analysis.memory_growth import MemoryGrowth
from perfmon_analysis.views import JobView

_NATIVE = ("SIGSEGV", "SIGABRT", "SIGBUS", "SIGILL", "SIGFPE")


def leak(view: JobView) -> MemoryGrowth | None:
    """The job's steady memory growth, None when its memory does not grow every step (or cannot tell)."""
    growth = view.health.growth
    return growth if growth is not None and growth.steady else None


def leak_text(growth: MemoryGrowth) -> str:
    """'host RSS grows 1.0MB every step (39MB/s) over the last 111 steps, now 452MB; most in other'."""
    rate = f" ({units.nbytes(growth.per_s)}/s)" if growth.per_s else ""
    kind = f"; most in {growth.kind}" if growth.kind else ""
    return (f"{growth.label} grows {units.nbytes(growth.per_step)} every step{rate} over the last {growth.steps} "
            f"steps, now {units.nbytes(growth.last)}{kind}")


def memory_explained(view: JobView) -> Explained:
    """The memory outcome's words: a leak named with its rate and what grows, else what is full;
    fixes for what grows, then for what is large (``advice.memory_fixes``)."""
    mem = view.metrics.memory
    growth = leak(view)
    where = "device memory" if mem.source == "device" else "host RSS"
    full = (f"{mem.ooms} out-of-memory error(s)" if mem.ooms else
            "allocator retries rising" if mem.alloc_retries_rising else
            f"{'window' if mem.source == 'device' else 'recent'} peak {units.nbytes(mem.peak_bytes)} is "
            f"{units.pct(mem.peak_frac)} of the {units.nbytes(mem.limit_bytes)} limit"
            if mem.peak_frac is not None else "")
    fixes = memory_fixes(mem, growth)
    if mem.source == "device" and not growth:
        fixes.append("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation")
    extra: dict[str, Any] = {"memory_rank": mem.rank}
    if growth is None:
        return f"Memory, {where}: {full}", fixes, extra
    extra.update(memory_growth_per_step=round(growth.per_step), memory_growth_rank=growth.rank)
    limit = ""
    if growth.steps_to_limit is not None and (mem.peak_frac or 0.0) < 1.0:
        limit = f"; at this rate the {units.nbytes(growth.limit)} limit is reached in ~{growth.steps_to_limit} steps"
    return f"Memory leak: {leak_text(growth)}" + (f" ({full})" if full else "") + limit, fixes, extra


def memory_severity(view: JobView) -> str:
    """Critical after an OOM or at or past the limit; a warning below it (a leak, a full window)."""
    mem = view.metrics.memory
    return "crit" if mem.ooms or (mem.peak_frac is not None and mem.peak_frac >= 1.0) else "warn"


class Crashed(Outcome):
    """The job ended on an exception or a non-zero exit: that is its story, whatever its steps said."""

    id = "crashed"
    label = "CRASHED"

    def applies(self, view: JobView) -> bool:
        return view.health.crash is not None

    def severity(self, view: JobView, losses: Losses, loss: str | None = None) -> str:
        return "crit"

    def explain(self, view: JobView, straggler: int | None, losses: Losses,
                answers: dict[str, Answer]) -> Explained:
        crash = view.health.crash
        if crash is None:
            return "Crashed", [], {}
        exit_ = f" ({crash.exit})" if crash.exit and crash.error else ""
        return crash.headline + exit_, crash_fixes(view, crash), {"crash": crash.as_json()}


def crash_fixes(view: JobView, crash: Crash) -> list[str]:
    """Where to look: the line that raised, and for an out-of-memory error the memory fixes; for an
    exit with no exception recorded, what exits that way."""
    fixes = []
    if crash.call:
        fixes.append(f"the line that raised, {crash.site}: {crash.call}; the whole traceback is in the job's "
                     "stderr (the job log when perfmon run shows the TUI)")
    elif crash.error:
        fixes.append("the traceback is in the job's stderr (the job log when perfmon run shows the TUI)")
    if crash.error and ("OutOfMemory" in crash.error or crash.error == "MemoryError"):
        fixes += memory_fixes(view.metrics.memory, leak(view))
    elif crash.error is None and crash.exit:
        if "SIGKILL" in crash.exit:
            fixes.append("SIGKILL: the kernel's OOM killer (dmesg | grep -i kill) or the scheduler (its job log) "
                         "ended it")
        elif any(sig in crash.exit for sig in _NATIVE):
            fixes.append("a crash in native code: PYTHONFAULTHANDLER=1 prints the Python stack at the fault")
        else:
            fixes.append(f"{crash.exit} with no uncaught Python exception: sys.exit() or os._exit() in the script "
                         "or a library, or a launcher that failed (torchrun prints which worker)")
    growth = leak(view)
    if growth is not None and not (crash.error and "OutOfMemory" in crash.error):
        fixes.append(f"memory grew every step before it ended: {leak_text(growth)}")
    return fixes


def findings(view: JobView) -> list[dict[str, Any]]:
    """``memory_growth`` (a steady growth, whatever the verdict) and ``step_outliers``."""
    out: list[dict[str, Any]] = []
    growth = leak(view)
    if growth is not None:
        out.append({"id": "memory_growth", **growth.as_json(), "message": f"memory leak: {leak_text(growth)}"})
    outliers = view.health.outliers
    if outliers:
        top = outliers[0]
        more = f" (+{len(outliers) - 1} more)" if len(outliers) > 1 else ""
        out.append({"id": "step_outliers", "steps": [o.as_json() for o in outliers],
                    "ratio": round4(top.ratio),
                    "message": f"step {top.step} took {units.seconds(top.dur)}, {top.ratio:.1f}x the median: "
                               f"{top.what}{more}"})
    return out
