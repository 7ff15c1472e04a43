"""One job's analysis behind one object: records in, the view, the verdict and the report out.

The commands, the exports, the app and the trainer callbacks hold an ``Analysis`` rather than
chaining the run model, the verdict and the report themselves, so the order (ingest, then one
view per instant, then the verdict over that view) is written once. A feed fills ``model``
directly; everything else goes through the methods here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from perfmon_analysis import report as _report
from perfmon_analysis.buffers import WINDOW_SECONDS, WINDOW_STEPS
from perfmon_analysis.gains import callback_values as gain_values
from perfmon_analysis.metrics import callback_values
from perfmon_analysis.readings import StepReading
from perfmon_analysis.runmodel import RunModel
from perfmon_analysis.verdict import Verdict, VerdictTracker, evaluate
from perfmon_analysis.views import JobView


@dataclass(frozen=True)
class Snapshot:
    """One instant of the job: its view and the verdict over it."""

    view: JobView
    verdict: Verdict


class Analysis:
    """Ingest records; read views, verdicts and reports.

    ``steady``: verdicts go through ``VerdictTracker`` (a new bottleneck shows after two
    evaluations agree), for displays that refresh; otherwise each verdict is judged afresh,
    as a one-off report wants."""

    def __init__(self, model: RunModel | None = None, *, window_steps: int = WINDOW_STEPS,
                 window_seconds: float = WINDOW_SECONDS, steady: bool = False) -> None:
        self.model = model if model is not None else RunModel(window_steps, window_seconds)
        self._tracker = VerdictTracker() if steady else None

    @classmethod
    def of_records(cls, streams: Iterable[tuple[str, Iterable[dict[str, Any]]]], **kwargs: Any) -> "Analysis":
        """An analysis of finished streams: ``(stream id, its records)`` each, every stream ended."""
        analysis = cls(**kwargs)
        for stream, records in streams:
            for record in records:
                analysis.ingest(stream, record)
            analysis.end_stream(stream)
        return analysis

    # -- records in --------------------------------------------------------------------------
    def ingest(self, stream: str, record: dict[str, Any], received: float | None = None) -> None:
        self.model.ingest(stream, record, received)

    def end_stream(self, stream: str) -> None:
        self.model.end_stream(stream)

    def add_problem(self, message: str) -> None:
        self.model.add_problem(message)

    def note_exit(self, record: dict[str, Any]) -> None:
        """How the job's command ended (``perfmon run``'s exit record: ``returncode``, ``t``)."""
        self.model.note_exit(record)

    @property
    def problems(self) -> list[str]:
        return self.model.problems

    # -- numbers out -------------------------------------------------------------------------
    def view(self, now: float | None = None, *, clock: float | None = None) -> JobView:
        """The window at ``now`` (None: the newest record); ``clock`` (live) lets silence count."""
        return self.model.view(now, clock=clock)

    def judge(self, view: JobView) -> Verdict:
        """The verdict over ``view`` (through the tracker when ``steady``), kept in the run's history
        when it changed (a warming-up window judges nothing)."""
        verdict = self._tracker.update(view) if self._tracker is not None else evaluate(view)
        if view.ranks and verdict.bottleneck != "warming_up":
            self.model.history.note_verdict(view.now, verdict.bottleneck, verdict.severity, verdict.headline)
        return verdict

    def snapshot(self, now: float | None = None, *, clock: float | None = None) -> Snapshot:
        view = self.view(now, clock=clock)
        return Snapshot(view, self.judge(view))

    def report(self, now: float | None = None, *, clock: float | None = None,
               source: dict[str, Any] | None = None, snapshot: Snapshot | None = None,
               price: float | None = None) -> dict[str, Any]:
        """The report JSON (``perfmon_analysis.report.build``) of ``snapshot``, else of the window at ``now``;
        ``price`` per device-hour puts money on the gains."""
        snap = snapshot if snapshot is not None else self.snapshot(now, clock=clock)
        return _report.build(snap.view, snap.verdict, retired=self.model.retired, source=source, price=price)

    def set_window(self, steps: int, seconds: float) -> None:
        """The window: the last ``steps`` steps or ``seconds``, whichever is fewer (``RunModel.set_window``)."""
        self.model.set_window(steps, seconds)

    def steps_in_window(self) -> dict[int, list[StepReading]]:
        """Each rank's steps in the window, oldest first (``RunModel.steps_in_window``)."""
        return self.model.steps_in_window()

    def callback_numbers(self, snapshot: Snapshot) -> dict[str, float]:
        """The trainer callbacks' ``perfmon/...`` scalars of one snapshot (known values only), what
        fixing each loss buys among them."""
        return {**callback_values(snapshot.view), **gain_values(snapshot.verdict.gains)}


def render_text(report: dict[str, Any], width: int = 80) -> str:
    """The report dict as text (``perfmon_analysis.report.render_text``)."""
    return _report.render_text(report, width)
