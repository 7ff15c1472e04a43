"""A ``capture`` record as the viewer reads it (perfmon_analysis.capture) and how the report prints it."""

from __future__ import annotations

from perfmon_analysis.capture import capture_reading
from perfmon_analysis.runmodel import RunModel
from tests.helpers import records as R
from tests.helpers.reports import report_and_text

RECORD = {"k": "capture", "t": 5.0, "id": 1, "steps": 3, "first_step": 10, "last_step": 12, "wall_s": 0.5,
          "path": "/r/x.capture-10.pt.trace.json.gz", "device_busy": 0.62,
          "top": [{"name": "aten::mm", "self_s": 0.2, "calls": 12}, {"name": "aten::add_", "self_s": 0.01, "calls": 3},
                  "junk"],
          "gaps": [{"seconds": 0.004, "at_s": 0.1}]}


def test_the_summary_keeps_what_the_probe_measured_and_drops_what_it_cannot_read():
    c = capture_reading(RECORD, rank=2)
    assert (c.rank, c.steps, c.first_step, c.last_step, c.path) == (2, 3, 10, 12, RECORD["path"])
    assert [(o.name, o.self_s, o.calls) for o in c.top] == [("aten::mm", 0.2, 12), ("aten::add_", 0.01, 3)]
    assert c.device_busy == 0.62 and c.gaps == ((0.004, 0.1),)
    assert c.lines() == ["rank 2: steps 10-12 -> /r/x.capture-10.pt.trace.json.gz",
                         "  device busy 62% of the captured steps; longest idle 4.0 ms",
                         "    200.00 ms      12x  aten::mm", "     10.00 ms       3x  aten::add_"]
    failed = capture_reading({"k": "capture", "t": 1.0, "steps": 0, "error": "torch.profiler did not start: X"}, 0)
    assert failed.lines() == ["rank 0: steps None-None: torch.profiler did not start: X"]


def test_the_report_lists_each_ranks_latest_capture():
    model = RunModel()
    for rank in (1, 0):
        model.ingest(f"s{rank}", R.hello(rank, t=0.0, proto=[1, 1], pid=rank))
        for step in range(8):
            model.ingest(f"s{rank}", R.step(step, start=float(step), dur=1.0))
    model.ingest("s1", dict(RECORD, t=2.0, path="/old"))
    model.ingest("s1", RECORD)
    report, text = report_and_text(model)
    assert [(c["rank"], c["path"]) for c in report["captures"]] == [(1, RECORD["path"])]
    assert "rank 1: steps 10-12 -> /r/x.capture-10.pt.trace.json.gz" in text


def test_the_json_carries_every_field_and_odd_values_read_as_unknown():
    c = capture_reading(RECORD, rank=2)
    assert c.as_json() == {
        "rank": 2, "steps": 3, "first_step": 10, "last_step": 12, "wall_s": 0.5,
        "path": "/r/x.capture-10.pt.trace.json.gz", "device_busy": 0.62, "error": None,
        "top": [{"name": "aten::mm", "self_s": 0.2, "calls": 12}, {"name": "aten::add_", "self_s": 0.01, "calls": 3}],
        "gaps": [{"seconds": 0.004, "at_s": 0.1}], "overhead": None, "baseline_step_s": None,
        "captured_step_s": None, "train_per_step_s": None, "thread_cpu_s": None}
    odd = capture_reading({"k": "capture", "t": True, "steps": True, "first_step": "1", "wall_s": "x", "path": 5,
                           "device_busy": False, "error": 3, "top": [{"name": "x" * 200, "self_s": "1",
                                                                      "calls": 2.5}],
                           "gaps": [{"seconds": None}]}, rank=0)
    assert (odd.t, odd.steps, odd.first_step, odd.wall_s, odd.path, odd.device_busy, odd.error) == \
        (0.0, 0, None, None, None, None, None)
    assert [(len(o.name), o.self_s, o.calls) for o in odd.top] == [(120, 0.0, 0)] and odd.gaps == ((0.0, 0.0),)
    many = capture_reading(dict(RECORD, top=[{"name": f"op{i}", "self_s": 0.001 * i, "calls": i} for i in range(8)]), 0)
    assert len(many.lines()) == 2 + 5            # head, device line, the five largest ... as given
    assert max(len(line) for line in many.lines(width=30)) == 30
    assert len(capture_reading(dict(RECORD, path="/r/" + "x" * 200), 0).lines()[0]) == 80     # the default width


def test_the_cost_is_the_captured_steps_mean_against_the_median_before_and_the_report_entry_keeps_it():
    from perfmon_analysis.capture import with_cost

    steps = [(s, 0.1) for s in range(10)] + [(10, 0.2), (11, 0.3), (12, 0.4)]
    c = with_cost(capture_reading(dict(RECORD, cost={"thread_cpu_s": 0.05}), rank=2), steps)
    assert (c.baseline_step_s, c.captured_step_s) == (0.1, 0.3)
    assert c.overhead == 0.3 / 0.1 - 1.0 and c.train_per_step_s == 0.3 - 0.1
    assert c.path == RECORD["path"] and c.rank == 2                     # the rest of the capture kept
    assert c.lines(120)[2] == ("  cost: captured steps took 300ms against 100ms before (200%); its own thread used "
                               "50ms CPU")
    again = capture_reading(c.as_json(), rank=2)                         # the report's entry read back
    assert (again.overhead, again.baseline_step_s, again.captured_step_s, again.thread_cpu_s) == \
        (c.overhead, 0.1, 0.3, 0.05)
    assert again.lines(120) == c.lines(120)
    # in the report's 80 columns the cost line wraps: its last figure, the thread's CPU, is never cut off
    assert c.lines(80)[2:4] == ["  cost: captured steps took 300ms against 100ms before (200%); its own thread",
                                "    used 50ms CPU"]
    assert with_cost(c, steps[:12]) is c                                 # a captured step missing: unchanged
    assert with_cost(c, steps[10:]) is c                                 # no step before it: unchanged
    bare = capture_reading(RECORD, rank=2)
    assert with_cost(bare, []) is bare and bare.lines()[1].endswith("longest idle 4.0 ms")
    idle = capture_reading(dict(RECORD, gaps=[]), rank=2)
    assert idle.lines()[1] == "  device busy 62% of the captured steps"
    long_gap = capture_reading(dict(RECORD, gaps=[{"seconds": 0.25, "at_s": 0.0}]), rank=2)
    assert long_gap.lines()[1].endswith("; longest idle 250.0 ms")
    unthreaded = with_cost(bare, steps)                                  # no thread CPU in the record
    assert unthreaded.lines(120)[2] == "  cost: captured steps took 300ms against 100ms before (200%)"
