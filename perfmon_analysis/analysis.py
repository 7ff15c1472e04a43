"""One job's analysis behind one object: records in, the view, the verdict and the report out.

The feeds, the commands, the relays, the exports, the app and the trainer callbacks hold an
``Analysis`` rather than chaining the run model, the verdict and the report themselves, so the
order (ingest, then one view per instant, then the verdict over that view) is written once, and
the run model stays inside it (as HTA's ``TraceAnalysis`` keeps its ``Trace``):
``tests/unit/test_command_imports.py`` forbids reaching into it from outside the core.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from perfmon_analysis import report as _report
from perfmon_analysis.buffers import WINDOW_SECONDS, WINDOW_STEPS
from perfmon_analysis.gains import callback_values as gain_values
from perfmon_analysis.groups import GroupReduction
from perfmon_analysis.history import History
from perfmon_analysis.metrics import callback_values
from perfmon_analysis.readings import StepReading
from perfmon_analysis.runmodel import RunModel
from perfmon_analysis.verdict import Verdict, VerdictTracker, evaluate
from perfmon_analysis.views import JobView

__all__ = ["Analysis", "Snapshot"]


@dataclass(frozen=True)
class Snapshot:
    """One instant of the job: its view and the verdict over it."""

    view: JobView
    verdict: Verdict


class Analysis:
    """Ingest records; read views, verdicts, reports, the run's history and the window.

    A verdict asked for ``steady`` goes through the one ``VerdictTracker`` this analysis holds (a
    new bottleneck shows after two evaluations agree), for a display that refreshes; otherwise each
    verdict is judged afresh, as a one-off report wants."""

    def __init__(self, *, window_steps: int = WINDOW_STEPS, window_seconds: float = WINDOW_SECONDS) -> None:
        self._model = RunModel(window_steps, window_seconds)
        self._tracker = VerdictTracker()

    @classmethod
    def of_records(cls, streams: Iterable[tuple[str, Iterable[dict[str, Any]]]], **kwargs: Any) -> Analysis:
        """An analysis of finished streams: ``(stream id, its records)`` each, every stream ended."""
        analysis = cls(**kwargs)
        for stream, records in streams:
            for record in records:
                analysis.ingest(stream, record)
            analysis.end_stream(stream)
        return analysis

    # -- records in --------------------------------------------------------------------------
    def ingest(self, stream: str, record: dict[str, Any], received: float | None = None) -> None:
        self._model.ingest(stream, record, received)

    def expect(self, stream: str, rank: int, job: str, pid: int, restart: int, clock: float | None) -> None:
        """A stream found (its socket named the rank) before its hello arrives (``RunModel.expect``)."""
        self._model.expect(stream, rank, job, pid, restart, clock)

    def end_stream(self, stream: str) -> None:
        self._model.end_stream(stream)

    def stream_ended(self, stream: str) -> bool:
        return self._model.stream_ended(stream)

    def forget(self, stream: str) -> None:
        """A rank a group relay no longer sends on: held in its group's reductions only."""
        self._model.forget(stream)

    def heard(self, stream: str, clock: float) -> None:
        """The rank's newest record reached its group relay at ``clock`` (``RunModel.heard``)."""
        self._model.heard(stream, clock)

    def set_groups(self, relay: str, reductions: list[GroupReduction]) -> None:
        """A group relay's reductions of its ranks (the relay tree, ``perfmon_analysis.groups``)."""
        self._model.set_groups(relay, reductions)

    def note_exit(self, record: dict[str, Any]) -> None:
        """How the job's command ended (``perfmon run``'s exit record: ``returncode``, ``t``)."""
        self._model.note_exit(record)

    def add_problem(self, message: str) -> None:
        self._model.add_problem(message)

    def drop_problem(self, message: str) -> None:
        """A problem that no longer holds (a restarted relay is back)."""
        if message in self._model.problems:
            self._model.problems.remove(message)

    @property
    def problems(self) -> list[str]:
        return list(self._model.problems)

    # -- numbers out -------------------------------------------------------------------------
    def view(self, now: float | None = None, *, clock: float | None = None) -> JobView:
        """The window at ``now`` (None: the newest record); ``clock`` (live) lets silence count."""
        return self._model.view(now, clock=clock)

    def judge(self, view: JobView, *, steady: bool = False) -> Verdict:
        """The verdict over ``view`` (through the tracker when ``steady``), kept in the run's history
        when it changed (a warming-up window judges nothing)."""
        verdict = self._tracker.update(view) if steady else evaluate(view)
        if view.ranks and verdict.bottleneck != "warming_up":
            self._model.history.note_verdict(view.now, verdict.bottleneck, verdict.severity, verdict.headline)
        return verdict

    def snapshot(self, now: float | None = None, *, clock: float | None = None, steady: bool = False) -> Snapshot:
        view = self.view(now, clock=clock)
        return Snapshot(view, self.judge(view, steady=steady))

    def report(self, now: float | None = None, *, clock: float | None = None,
               source: dict[str, Any] | None = None, snapshot: Snapshot | None = None,
               price: float | None = None) -> dict[str, Any]:
        """The report JSON (``perfmon_analysis.report.build``) of ``snapshot``, else of the window at ``now``;
        ``price`` per device-hour puts money on the gains."""
        snap = snapshot if snapshot is not None else self.snapshot(now, clock=clock)
        return _report.build(snap.view, snap.verdict, retired=self._model.retired, source=source, price=price)

    def text_report(self, snapshot: Snapshot, *, price: float | None = None, width: int = 80) -> str:
        """``snapshot``'s report as text (``perfmon_analysis.report.render_text``), the words of what
        ``report(snapshot=snapshot)`` says as JSON."""
        return _report.render_text(snapshot.view, snapshot.verdict, retired=self._model.retired, price=price,
                                   width=width)

    @property
    def history(self) -> History:
        """The whole run, downsampled (the trends screen, the HTML report)."""
        return self._model.history

    @property
    def window(self) -> tuple[int, float]:
        """(steps, seconds): the window is the last ``steps`` steps or ``seconds``, whichever is fewer."""
        return self._model.window_steps, self._model.window_seconds

    def set_window(self, steps: int, seconds: float) -> None:
        self._model.set_window(steps, seconds)

    def steps_in_window(self) -> dict[int, list[StepReading]]:
        """Each rank's steps in the window, oldest first (``RunModel.steps_in_window``)."""
        return self._model.steps_in_window()

    def summary(self, stream: str, t: float, after: int = -1) -> tuple[int, dict[str, Any]] | None:
        """A relay's summary of one rank (``perfmon_analysis.summary``), when it changed since ``after``."""
        return self._model.summary(stream, t, after)

    def buffered(self, stream: str) -> list[dict[str, Any]]:
        """The records a newly subscribed rank's viewer gets first (``RunModel.buffered``)."""
        return self._model.buffered(stream)

    def callback_numbers(self, snapshot: Snapshot) -> dict[str, float]:
        """The trainer callbacks' ``perfmon/...`` scalars of one snapshot (known values only), what
        fixing each loss buys among them."""
        return {**callback_values(snapshot.view), **gain_values(snapshot.verdict.gains)}



