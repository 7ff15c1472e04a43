"""What the verdict says about the loop's own work between steps (docs/verdict.md, "Between steps"),
and about the thread that holds the GIL while the training thread waits.

Time between steps that recurs on every step is judged like any other loss (``questions.LoopWork``):
a wait there is a host wait (``outcomes.HostWait``), busy work preparing the next step's input is
data preprocessing on the training thread (``outcomes.DataPreprocessing``), other busy work is its
own outcome (``LoopWorkOutcome``). Their words live here, beside the GIL's holder, which any wait can
name. Pure; every number goes through ``perfmon_analysis.units``.
"""

from __future__ import annotations

from perfmon_analysis import units
from perfmon_analysis.explain import where_text
from perfmon_analysis.flowchart import GIL_HOLDER_MIN, Answer, Explained, Losses, Outcome
from perfmon_analysis.losses import LOOP, by_id
from perfmon_analysis.readings import SPANS
from perfmon_analysis.views import HolderLine, JobView, WhereLine

_pct = units.pct
STEP, BETWEEN = SPANS


def via_loop(answers: dict[str, Answer]) -> bool:
    """Did the walk name the loop's work between steps (rather than a loss inside steps)?"""
    loop = answers.get(LOOP)
    return loop is not None and loop.answer == "yes"


def top_line(view: JobView, span: str, state: str | None) -> WhereLine | None:
    return next(iter(view.where.top(1, state, span)), None) if view.where is not None else None


def holder(view: JobView, span: str) -> HolderLine | None:
    """The thread seen holding the GIL in most of the training thread's waiting samples of ``span``."""
    held = view.where.holder(span) if view.where is not None else None
    return held if held is not None and held.of_waiting >= GIL_HOLDER_MIN else None


def gil_text(held: HolderLine) -> str:
    """'thread `metrics-encoder` holds the GIL 95% of the step in `encode_forever` at x.py:21'."""
    return (f"thread `{held.thread}` holds the GIL {_pct(held.share)} of the step in `{held.function}` at "
            f"{held.site}")


def gil_fixes(held: HolderLine) -> list[str]:
    return [f"thread `{held.thread}` runs Python in {held.function} at {held.site} while the training thread waits "
            "for the GIL: move that work out of the process (multiprocessing, a separate service) or into code "
            "that releases the GIL (torch/numpy ops on whole arrays, a C extension); on a free-threaded Python "
            "(3.13t and later) the threads run Python in parallel"]


_LOOP_WAIT_FIXES = ["take the wait off the training thread: hand the work to a background thread or process "
                    "through a queue, so the next step starts at once",
                    "a lock shared with another thread: hold it only to swap a buffer, never while writing out",
                    "do it every N steps instead of every step"]


def loop_wait(view: JobView, losses: Losses) -> Explained:
    """The loop waits between steps: the top waiting line there says where."""
    share = by_id(losses)[LOOP].share
    line = top_line(view, BETWEEN, "waiting")
    held = holder(view, BETWEEN)
    fixes = list(_LOOP_WAIT_FIXES)
    extra: dict[str, object] = {}
    if held is not None:
        fixes = gil_fixes(held) + fixes
        extra["gil_holder"] = held.as_json()
    gil = f"; {gil_text(held)}" if held is not None else ""
    if line is None:
        return (f"Host wait: {_pct(share)} of each step waits between steps, in the loop's own work; no stack "
                f"samples say where{gil}", fixes, extra)
    fixes.insert(0, f"start with {where_text(line)}: {_pct(line.share)} ± {_pct(line.err)} of each step waits there "
                    "between steps (key u: every line)")
    extra["where_top"] = f"{line.file}:{line.line}"
    return (f"Host wait: {_pct(share)} of each step waits between steps, most in {where_text(line)} "
            f"({_pct(line.share)}){gil}", fixes, extra)


def loop_prep(view: JobView, losses: Losses) -> Explained:
    """Busy work before the step's lines: the next batch built on the training thread between steps."""
    share = by_id(losses)[LOOP].share
    line = top_line(view, BETWEEN, "busy")
    at = f", most in {where_text(line)} ({_pct(line.share)})" if line is not None else ""
    fixes = ["move the preparation into a Dataset and a DataLoader(num_workers=N), so batches are built while "
             "the step runs", "preprocess offline (cache tokenized or decoded data)",
             "batch the work: one vectorised call per batch instead of a Python loop per sample"]
    if line is not None:
        fixes.insert(0, f"start with {where_text(line)}: {_pct(line.share)} ± {_pct(line.err)} of each step")
    return (f"Data preprocessing: {_pct(share)} of each step prepares the next batch on the training thread "
            f"between steps{at}", fixes, {"where_top": f"{line.file}:{line.line}"} if line is not None else {})


class LoopWorkOutcome(Outcome):
    """Busy work between steps that does not prepare the next step (logging, metrics, bookkeeping)."""

    id = "loop_work"
    label = "LOOP WORK"
    pane = "timeline"
    loss = LOOP

    def explain(self, view: JobView, straggler: int | None, losses: Losses,
                answers: dict[str, Answer]) -> Explained:
        share = by_id(losses)[LOOP].share
        line = top_line(view, BETWEEN, "busy")
        at = f", most in {where_text(line)} ({_pct(line.share)})" if line is not None else ""
        fixes = ["do it every N steps instead of every step (logging, metrics, validation of the batch)",
                 "hand it to a background thread or process through a queue; keep the training thread stepping",
                 "keep metrics on the device and read them every N steps"]
        if line is not None:
            fixes.insert(0, f"start with {where_text(line)}: {_pct(line.share)} ± {_pct(line.err)} of each step")
        elif view.where is None:
            fixes.append("stack samples between steps (wire 1.5) say which line: a newer probe sends them")
        return (f"Loop work: {_pct(share)} of each step is the loop's own work between steps{at}", fixes,
                {"where_top": f"{line.file}:{line.line}"} if line is not None else {})
