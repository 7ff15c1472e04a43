"""One judgement per question: every pane marker is the verdict's answer to that flowchart node.

The panes are drawn through their own ``draw`` (what the app renders) for generated windows,
and the marker each shows for a node (``!`` yes, ``·`` no, none: not asked) is compared with
``Verdict.answers`` for that node.
"""

from __future__ import annotations

import dataclasses
import re

from hypothesis import given, settings, strategies as st
from rich.text import Text

from perfmon_analysis import units, verdict as V
from perfmon_analysis.views import JobView, MemoryMetrics
from tests.unit.verdict_synth import Rank, job
from tui.app.widgets.comm import CommPane
from tui.app.widgets.data import DataPane
from tui.app.widgets.device import DevicePane
from tui.app.widgets.memory import MemoryPane
from tui.app.widgets.pane import UiState

PEAK = 100e12
# node -> (pane, the words before the judged number on its line)
SHOWN = {"data_wait": (DataPane, "wait "), "loader_cpu": (DataPane, "loader CPU "),
         "device_busy": (DevicePane, "busy "), "memory": (MemoryPane, "peak "),
         "comm_exposed": (CommPane, "exposed "), "straggler": (CommPane, "balance ")}
MARK = {"!": "yes", "·": "no", None: None}


def _gpu_view() -> JobView:
    return job(Rank(0, gpu_util=97, flops=PEAK * 0.05), Rank(1, gpu_util=97, flops=PEAK * 0.05),
               device="cuda", peak=PEAK).view()


def _cpu_view() -> JobView:
    return job(Rank(0), Rank(1)).view()


BASES = {"cuda": _gpu_view(), "cpu": _cpu_view()}


def draw(pane_type: type, view: JobView, verdict: V.Verdict | None) -> str:
    lines = pane_type().draw(view, verdict, UiState(), 200, 40)
    return "\n".join(x.plain for x in lines) if isinstance(lines, list) else Text(str(lines)).plain


def markers(view: JobView, verdict: V.Verdict | None) -> dict[str, tuple[str, str | None]]:
    """node -> (the number as drawn, its marker's answer) for every judged number the panes show."""
    text = {pane: draw(pane, view, verdict) for pane in {p for p, _ in SHOWN.values()}}
    out = {}
    for node_id, (pane, words) in SHOWN.items():
        found = re.search(re.escape(words) + r"(\S+)(?: ([!·]))? \(", text[pane])
        if found:
            out[node_id] = (found.group(1), MARK[found.group(2)])
    return out


share = st.one_of(st.none(), st.floats(0.0, 1.0))


@st.composite
def views(draw_: st.DrawFn) -> JobView:
    device = draw_(st.sampled_from(["cuda", "cpu"]))
    base = BASES[device]
    metrics = dataclasses.replace(
        base.metrics,
        device_busy=draw_(share), device_busy_source=draw_(st.sampled_from([None, "nvml_util", "sm_active",
                                                                             "thread_cpu"])),
        data_wait_frac=draw_(share), data_cpu_frac=draw_(share), loader_cpu=draw_(share),
        loader_workers=draw_(st.one_of(st.none(), st.integers(0, 8))),
        comm_frac=draw_(share), comm_exposed_frac=draw_(share), off_cpu_frac=draw_(share),
        compute_ratio=draw_(st.one_of(st.none(), st.floats(0.1, 1.0))),
        straggler_by=draw_(st.sampled_from([None, "compute", "arrival"])),
        arrival_ratio=draw_(st.one_of(st.none(), st.floats(0.1, 1.0))),
        syncs_per_step=draw_(st.one_of(st.none(), st.floats(0.0, 10.0))), host_wait_frac=draw_(share),
        mfu=draw_(share),
        memory=MemoryMetrics(source=draw_(st.sampled_from([None, "device", "host"])), peak_frac=draw_(share),
                             peak_bytes=1, limit_bytes=2, ooms=draw_(st.sampled_from([0, 0, 1])),
                             alloc_retries_rising=draw_(st.booleans())))
    return dataclasses.replace(base, metrics=metrics)


@settings(max_examples=150, deadline=None)
@given(views())
def test_every_pane_marker_is_the_verdicts_answer_for_that_node(view):
    verdict = V.evaluate(view)
    shown = markers(view, verdict)
    assert {"data_wait", "loader_cpu", "device_busy", "comm_exposed", "straggler"} <= set(shown)
    for node_id, (number, answer) in shown.items():
        said = verdict.answers[node_id]
        assert answer == said.answer, (node_id, number, said)
        drawn = units.number(said.value, 2) if node_id == "straggler" else units.pct(said.value)
        assert number == drawn, (node_id, said)


def _comm_over_data() -> JobView:
    base = BASES["cuda"]
    return dataclasses.replace(base, metrics=dataclasses.replace(
        base.metrics, device_busy=0.9, device_busy_source="nvml_util", data_wait_frac=0.08, comm_frac=0.25,
        comm_exposed_frac=0.20, compute_ratio=0.95, straggler_by="compute", loader_workers=4, loader_cpu=0.05))


def test_a_data_wait_over_five_percent_under_a_larger_loss_is_not_marked_as_the_problem():
    """Data wait 8%, exposed communication 20%: the chart answers "no" at the data question (not the
    largest loss), and the data pane says so instead of a red "8% !"."""
    view = _comm_over_data()
    verdict = V.evaluate(view)
    assert verdict.bottleneck == "communication"
    assert verdict.answers["data_wait"].answer == "no"
    line = draw(DataPane, view, verdict).splitlines()[0]
    assert line.startswith("wait 8% · (exposed communication 20% is larger)"), line
    assert "!" not in line
    comm = draw(CommPane, view, verdict)
    assert "exposed 20% ! (≥10%)" in comm
    alone = dataclasses.replace(view, metrics=dataclasses.replace(view.metrics, comm_exposed_frac=0.02))
    assert draw(DataPane, alone, V.evaluate(alone)).splitlines()[0].startswith("wait 8% ! (≥5%)")


def test_the_loader_cpu_the_pane_shows_is_the_one_the_verdict_judged():
    base = BASES["cpu"]
    main = dataclasses.replace(base, metrics=dataclasses.replace(
        base.metrics, data_wait_frac=0.3, loader_workers=0, loader_cpu=0.9, data_cpu_frac=0.1))
    verdict = V.evaluate(main)
    assert verdict.bottleneck == "data_loading"      # the main process's 10%, not the workers' 90%
    assert "loader CPU 10% · (≥30%) main process (num_workers=0)" in draw(DataPane, main, verdict)
    workers = dataclasses.replace(main, metrics=dataclasses.replace(main.metrics, loader_workers=4))
    verdict = V.evaluate(workers)
    assert verdict.bottleneck == "data_preprocessing"
    assert "loader CPU 90% ! (≥30%) of a core per worker" in draw(DataPane, workers, verdict)


def test_a_busy_device_starved_by_a_large_loss_says_what_decided():
    base = BASES["cuda"]
    view = dataclasses.replace(base, metrics=dataclasses.replace(
        base.metrics, device_busy=0.9, device_busy_source="nvml_util", data_wait_frac=0.12, loader_workers=4,
        loader_cpu=0.05))
    verdict = V.evaluate(view)
    assert verdict.answers["device_busy"].answer == "yes"
    assert draw(DevicePane, view, verdict).startswith("busy 90% ! (a loss of 12% ≥10%)")


def test_before_any_verdict_a_pane_judges_nothing():
    shown = markers(_comm_over_data(), None)
    assert len(shown) >= 5 and set(shown.values()) == {("n/a", None)}


def test_the_ranks_pane_calls_a_rank_stalled_by_the_probes_stall_rule_only():
    """The state column draws the probe's stall (docs/verdict.md §2, 0), never a rule of its own: a rank
    long past its usual step with no stall reading is not called stalled, one with a stall is."""
    import dataclasses

    from perfmon_analysis.readings import stall_reading
    from tests.unit.verdict_synth import Rank, job
    from tui.app.widgets.ranks import _state

    row = job(Rank(dur=0.1)).view().ranks[0]
    late = dataclasses.replace(row, since_last_step_s=30.0)
    assert _state(late, None).plain == "ok"
    stall = stall_reading({"k": "stall", "t": 100.0, "seconds": 20.0, "where": "step", "stack": []})
    stalled = dataclasses.replace(row, stall=stall, stalled_s=21.0)
    assert _state(stalled, None).plain == "stalled 21s"


def test_the_ranks_pane_shows_each_ranks_place_and_marks_no_rank_the_verdict_does_not_name():
    """A pipeline's ranks carry their place, in stage order; a slow stage names no rank, so none is
    marked, whatever the per-rank statistics would pick."""
    from tests.helpers.ops_jobs import view
    from tui.app.widgets.ranks import RanksPane

    v = view(pp=2, dp=2, steps=8, compute=lambda st, s, d: (3.0, 6.0) if s == 1 else (1.0, 2.0))
    verdict = V.evaluate(v)
    assert verdict.bottleneck == "slow_stage" and verdict.straggler_rank is None
    text = draw(RanksPane, v, verdict)
    assert "place" in text and "pp1 dp1" in text and "straggler" not in text and "◀" not in text
