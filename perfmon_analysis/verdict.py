"""The verdict: loss accounting walked through the diagnosis flowchart.

The chart (``CHART``) joins the questions of ``perfmon_analysis.questions`` and the outcomes of
``perfmon_analysis.outcomes`` (one object each; ``perfmon_analysis.flowchart`` has the types and
the walk). It asks the usual triage questions in this order (docs/verdict.md): memory first;
then "is the device starved?", which fires when busy is under 70% or when any single measured
loss (``perfmon_analysis.losses``) takes 10% of the step; then the largest measured loss names
the bottleneck (the others that fired become secondary findings); then compute efficiency. A
stuck job and one warming up end the verdict before any question (``Chart.before``).

Every question is answered once per evaluation, on the walk's path or not; ``Verdict.answers``
is that one judgement of each number, which the panes draw instead of comparing numbers with
thresholds themselves.

Unknown is unknown: a quantity that was not measured never picks an exit. A question that cannot
be asked is recorded with the reason; the walk goes on with what is known, and where the last
question before an outcome could not be asked (loader CPU, per-rank compute, sync counts) the
verdict names the measured loss and says which causes it cannot tell apart (``Verdict.undecided``).

Pure: ``evaluate(view)`` depends only on the ``JobView``; ``VerdictTracker`` adds the
two-agreeing-evaluations rule on top.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from perfmon_analysis import straggler_verdict, units
from perfmon_analysis.explain import findings as secondary_findings, where_text  # findings: beside the outcome
from perfmon_analysis.flowchart import Answer, Chart, Losses, Outcome, round4
from perfmon_analysis.gains import Gains, estimate as estimate_gains
from perfmon_analysis.losses import LOOP, Loss, account, overrun
from perfmon_analysis.outcomes import OUTCOMES
from perfmon_analysis.questions import QUESTIONS, qualifying
from perfmon_analysis.stuck import StuckDiagnosis
from perfmon_analysis.views import JobView, WhereLine, WhereTable

__all__ = ["BOTTLENECKS", "CHART", "Verdict", "VerdictTracker", "WHERE_TOP", "evaluate", "label", "walk"]

_pct = units.pct
WHERE_TOP = 5     # lines of ``verdict.where`` in the report

@dataclass(frozen=True)
class Verdict:
    """The answer for one view.

    ``path``: question ids walked; ``answers``: every question's answer (on the path or not), the
    judgement the panes show; ``evidence``: the numbers behind each answer, plus
    ``skipped`` {question: reason} for questions that could not be asked;
    ``losses``: the window's loss accounting; ``gains``: what removing each would buy;
    ``undecided``: {question: reason} where the outcome's own question could not be asked (the verdict names
    the loss, not its cause); ``findings``: secondary findings, each a dict with ``id`` (see
    FINDINGS); ``pending``: a different bottleneck seen once, waiting for
    confirmation (tracker only); ``where``: the window's in-step stack samples
    per user line (None when no rank sent any).
    """

    bottleneck: str
    severity: str                    # "ok" | "info" | "warn" | "crit"
    headline: str
    path: list[str]
    evidence: dict[str, Any]
    suggestions: list[str]
    straggler_rank: int | None = None
    findings: list[dict[str, Any]] = field(default_factory=list)
    pending: str | None = None
    losses: tuple[Loss, ...] = ()
    undecided: dict[str, str] = field(default_factory=dict)
    stuck: StuckDiagnosis | None = None
    straggler_host: str | None = None    # the node of ``straggler_rank`` (the report's verdict.straggler_host)
    where: WhereTable | None = None
    answers: dict[str, Answer] = field(default_factory=dict)
    gains: Gains | None = None           # what removing each loss would buy (perfmon_analysis.gains)
    loss: str | None = None              # the loss the outcome names on this walk (``Outcome.named``)

    @property
    def outcome(self) -> Outcome:
        return CHART.outcomes[self.bottleneck]

    def steps(self) -> list[Answer]:
        """Each question on the path as the walk answered it."""
        return [self.answers[n] for n in self.path if n in self.answers]

    @property
    def finding_ids(self) -> list[str]:
        return [str(f["id"]) for f in self.findings if f.get("id")]

    def gain_headline(self, price: float | None = None, compact: bool = False) -> str | None:
        """What fixing the named loss buys ('fixing it: up to 1.4× faster, 3.1 GPU-h/day'); a healthy
        job that loses time between steps is priced on that time. The outcomes before the walk (crashed,
        stuck, warming up) have no gains to price."""
        if self.gains is None:
            return None
        loss = self.loss or ("step_gaps" if self.bottleneck == "healthy" and self.severity != "ok" else None)
        return self.gains.headline(loss, price, compact)

    def as_json(self, price: float | None = None) -> dict[str, Any]:
        """The report's ``verdict`` object; ``unknown`` maps each quantity that was not measured to why;
        ``price``: per device-hour, for the gains' money."""
        skipped = self.evidence.get("skipped", {}) if isinstance(self.evidence, dict) else {}
        return {"bottleneck": self.bottleneck, "label": self.outcome.label, "severity": self.severity,
                "headline": self.headline, "path": list(self.path), "loss": self.loss,
                "evidence": dict(self.evidence),
                "suggestions": list(self.suggestions), "straggler_rank": self.straggler_rank,
                "straggler_host": self.straggler_host,
                "losses": [x.as_json() for x in self.losses], "undecided": dict(self.undecided),
                "unknown": {CHART.questions[n].quantity: why for n, why in skipped.items() if n in CHART.questions},
                "stuck": self.stuck.as_json() if self.stuck is not None else None,
                "where": [x.as_json() for x in self.where_lines()[:WHERE_TOP]] if self.where is not None else None,
                **(self.gains.as_json(price) if self.gains is not None
                   else {"gains": [], "gains_combined": None, "gains_basis": None}),
                "gain_headline": self.gain_headline(price)}

    def where_lines(self) -> tuple[WhereLine, ...]:
        """The window's sampled lines, largest first; a host wait puts its waiting lines first, since
        the time off CPU is the time it names."""
        if self.where is None:
            return ()
        if self.bottleneck != "host_wait":
            return self.where.lines
        return tuple(sorted(self.where.lines, key=lambda x: x.state != "waiting"))


# -- evaluation --------------------------------------------------------------------------------
CHART = Chart((*QUESTIONS, *straggler_verdict.QUESTIONS), (*OUTCOMES, *straggler_verdict.OUTCOMES), root="memory",
              before=("crashed", "stuck", "warming_up"))
BOTTLENECKS: tuple[str, ...] = tuple(CHART.outcomes)


def walk(view: JobView, losses: Losses | None = None, answers: dict[str, Answer] | None = None,
         chart: Chart = CHART) -> tuple[str, list[str], dict[str, Any]]:
    """Walk ``chart`` by the view's answers: (outcome, question ids visited, evidence)."""
    losses = account(view.metrics, view.device_type, view.comm_status) if losses is None else losses
    return chart.walk(chart.ask(view, losses) if answers is None else answers)


def evaluate(view: JobView, chart: Chart = CHART) -> Verdict:
    """The verdict for one view (pure). Every question is answered even when an outcome comes
    before the walk (stuck, warming up), so a pane always shows the verdict's judgement, never its own."""
    losses = account(view.metrics, view.device_type, view.comm_status)
    answers = chart.ask(view, losses)
    first = next((o for o in chart.before if o.applies(view)), None)
    if first is not None:
        return _before_walk(first, view, losses, answers)
    leaf, path, evidence = chart.walk(answers)
    m = view.metrics
    outcome = chart.outcomes[leaf]
    straggler = view.straggler_rank if leaf == "load_imbalance" else \
        view.straggling.rank if leaf == "slow_worker" and view.straggling is not None else None
    for key, value in (("step_time_median_s", m.step_time_median_s), ("device_busy", m.device_busy),
                       ("data_wait_frac", m.data_wait_frac), ("comm_exposed_frac", m.comm_exposed_frac)):
        evidence.setdefault(key, round4(value))
    headline, suggestions, extra = outcome.explain(view, straggler, losses, answers)
    undecided = evidence.get("undecided", {})
    for qid in undecided:
        headline += f"; cannot tell {chart.questions[qid].decides_between} ({_short_reason(undecided[qid])})"
    evidence.update(extra)
    named = outcome.named(answers)
    found = _loss_findings(named, losses, view.where) + _accounting(losses) + secondary_findings(view)
    simulated = view.straggling if leaf in straggler_verdict.CAUSE_OUTCOMES.values() else None
    gains = estimate_gains(view, losses, tuple(x.id for x in qualifying(losses)),
                           simulated={outcome.loss: (simulated.gain, simulated.why_no_gain or "")}
                           if simulated is not None and outcome.loss else None)
    return Verdict(leaf, outcome.severity(view, losses, named), headline, path, evidence, suggestions, straggler,
                   found, losses=losses, undecided=dict(undecided), straggler_host=_host_of(view, straggler),
                   where=view.where, answers=answers, gains=gains, loss=named)


def _before_walk(outcome: Outcome, view: JobView, losses: Losses, answers: dict[str, Answer]) -> Verdict:
    """An outcome that ends the verdict before any question: a stuck job, or one warming up."""
    headline, suggestions, extra = outcome.explain(view, None, losses, answers)
    culprit = None
    if view.stuck is not None and outcome.id == "stuck":
        culprits = view.stuck.culprit_ranks
        culprit = culprits[0] if len(culprits) == 1 else None
    return Verdict(outcome.id, outcome.severity(view, losses), headline, [], extra, suggestions, culprit,
                   secondary_findings(view), losses=losses, stuck=view.stuck if outcome.id == "stuck" else None,
                   straggler_host=_host_of(view, culprit), where=view.where, answers=answers)


def _host_of(view: JobView, rank: int | None) -> str | None:
    row = next((r for r in view.ranks if r.rank == rank), None) if rank is not None else None
    return row.host if row is not None else None


def _short_reason(reason: str) -> str:
    return reason.split(": cannot tell")[0]


def _loss_findings(named: str | None, losses: Losses, where: WhereTable | None = None) -> list[dict[str, Any]]:
    """Measured losses over their threshold that the outcome does not name (``named``); the unexplained
    one and the loop's work between steps say where the host thread spends them most, when stack samples
    say so."""
    top = {"device_idle": where.top(1, "waiting") if where is not None else (),
           LOOP: where.top(1, None, "between") if where is not None else ()}
    return [{"id": x.id, "share": round4(x.share), "source": x.source,
             "message": f"{x.label} also takes {_pct(x.share)} of each step"
                        + (f" (most {line.state or 'sampled'} in {where_text(line)})"
                           if (line := next(iter(top.get(x.id, ())), None)) is not None else "")}
            for x in qualifying(losses) if x.id != named]


def _accounting(losses: Losses) -> list[dict[str, Any]]:
    """The ``accounting`` finding: measured losses that add up past the whole (two count the same time)."""
    over = overrun(losses)
    if over is None:
        return []
    parts = ", ".join(f"{x.label} {_pct(x.share)}" for x in losses if x.share)
    return [{"id": "accounting", "over": round4(over),
             "message": f"the measured losses add up to {_pct(1.0 + over)} of the step ({parts}): two of them count "
                        "the same time; their shares are not to be trusted"}]


def label(bottleneck: str) -> str:
    """The outcome's display label (one spelling for the bar, the report and the flowchart)."""
    outcome = CHART.outcomes.get(bottleneck)
    return outcome.label if outcome else bottleneck.upper().replace("_", " ")


class VerdictTracker:
    """Hysteresis: a different bottleneck replaces the shown one only after two evaluations in a row
    agree on it. While the bottleneck stays the same the numbers refresh every evaluation."""

    def __init__(self) -> None:
        self.current: Verdict | None = None
        self._candidate: str | None = None

    def update(self, view: JobView) -> Verdict:
        new = evaluate(view)
        cur = self.current
        if cur is not None and new.bottleneck == cur.bottleneck:
            self._candidate = None
            self.current = new
            return new
        if (cur is None and new.bottleneck == "warming_up") or self._candidate == new.bottleneck:
            self._candidate = None
            self.current = new
            return new
        self._candidate = new.bottleneck
        shown = cur or Verdict("warming_up", "info", "Warming up: confirming the first verdict", [], {}, [])
        self.current = shown
        return dataclasses.replace(shown, pending=new.bottleneck, findings=new.findings)
