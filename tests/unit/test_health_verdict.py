"""The verdict's parts for the run beyond its window (perfmon_analysis.health_verdict): a crash's
fixes, a memory leak's words and severity, the memory_growth and step_outliers findings."""

from __future__ import annotations

import dataclasses

from perfmon_analysis import health_verdict as HV
from perfmon_analysis.crash import Crash
from perfmon_analysis.memory_growth import MemoryGrowth
from perfmon_analysis.step_times import Outlier
from perfmon_analysis.views import JobView
from tests.unit.verdict_synth import Rank, job

BASE = job(Rank()).view()        # one CPU rank; host RSS 1.1GB of a 17.2GB limit
# host RSS growing 1 MB a step (39 MB/s) over 111 steps, to 452 MB; a 1 GB limit 548 steps away
LEAK = MemoryGrowth(rank=1, series="rss", per_step=1e6, per_s=39e6, steps=111, points=40, first=300_000_000,
                    last=452_000_000, fit=0.99, steady=True, kind="other", limit=1_000_000_000, steps_to_limit=548)
LEAK_TEXT = ("host RSS grows 1.0MB every step (39.0MB/s) over the last 111 steps, now 452.0MB; most in other")
OUTLIERS = (Outlier(0, 9, 0.6, 6.0, "pause", "time between steps", 0.5), Outlier(1, 19, 0.5, 5.0, "pause", "x", 0.4))
STDERR = "the traceback is in the job's stderr (the job log when perfmon run shows the TUI)"


def _view(crash: Crash | None = None, growth: MemoryGrowth | None = None, outliers: tuple[Outlier, ...] = (),
          **memory: object) -> JobView:
    metrics = dataclasses.replace(BASE.metrics, memory=dataclasses.replace(BASE.metrics.memory, **memory))
    health = dataclasses.replace(BASE.health, crash=crash, growth=growth, outliers=outliers)
    return dataclasses.replace(BASE, health=health, metrics=metrics)


def test_a_leak_is_worded_with_its_rate_what_grows_and_where_it_is_now():
    assert HV.leak_text(LEAK) == LEAK_TEXT
    assert HV.leak_text(dataclasses.replace(LEAK, per_s=None, kind=None)) == \
        "host RSS grows 1.0MB every step over the last 111 steps, now 452.0MB"


def test_an_exit_without_an_exception_says_what_exits_that_way():
    native = HV.crash_fixes(_view(), Crash(0, None, "", 10, exit="killed by SIGSEGV"))
    assert native == ["a crash in native code: PYTHONFAULTHANDLER=1 prints the Python stack at the fault"]
    assert HV.crash_fixes(_view(), Crash(0, None, "", 10, exit="exit code 3")) == [
        "exit code 3 with no uncaught Python exception: sys.exit() or os._exit() in the script or a library, or a "
        "launcher that failed (torchrun prints which worker)"]
    assert HV.crash_fixes(_view(), Crash(0, "ValueError", "bad", 10)) == [STDERR]


def test_an_out_of_memory_crash_gets_the_memory_fixes_and_a_leak_before_another_error_is_said():
    oom = Crash(0, "torch.OutOfMemoryError", "oom", 10, file="/u/t.py", line=3, function="f", call="x = big()")
    fixes = HV.crash_fixes(_view(growth=LEAK), oom)
    assert fixes[0] == ("the line that raised, t.py:3 in f: x = big(); the whole traceback is in the job's stderr "
                        "(the job log when perfmon run shows the TUI)")
    assert fixes[1:] == HV.memory_fixes(BASE.metrics.memory, LEAK) and fixes[1].startswith("find what the loop keeps")
    # a MemoryError gets them too, and the growth that preceded it is said last
    fixes = HV.crash_fixes(_view(growth=LEAK), Crash(0, "MemoryError", "", 10))
    assert fixes == [STDERR, *HV.memory_fixes(BASE.metrics.memory, LEAK),
                     f"memory grew every step before it ended: {LEAK_TEXT}"]
    assert HV.crash_fixes(_view(growth=LEAK), Crash(0, "KeyError", "", 10)) == \
        [STDERR, f"memory grew every step before it ended: {LEAK_TEXT}"]


def test_the_findings_are_the_leak_and_the_outliers_with_how_many_more():
    leak, outliers = HV.findings(_view(growth=LEAK, outliers=OUTLIERS))
    assert leak == {"id": "memory_growth", **LEAK.as_json(), "message": f"memory leak: {LEAK_TEXT}"}
    assert outliers == {"id": "step_outliers", "steps": [o.as_json() for o in OUTLIERS], "ratio": 6.0,
                        "message": "step 9 took 600ms, 6.0x the median: time between steps (+1 more)"}
    (one,) = HV.findings(_view(outliers=OUTLIERS[:1]))
    assert one["message"] == "step 9 took 600ms, 6.0x the median: time between steps"
    assert HV.findings(_view(growth=dataclasses.replace(LEAK, steady=False))) == []


def test_a_leak_headline_says_how_full_memory_is_and_when_the_limit_is_reached_unless_it_is():
    text, fixes, extra = HV.memory_explained(_view(growth=LEAK, source="host", peak_bytes=452_000_000,
                                                   limit_bytes=1_000_000_000, peak_frac=0.452))
    assert text == (f"Memory leak: {LEAK_TEXT} (recent peak 452.0MB is 45% of the 1.0GB limit); at this rate the "
                    "1.0GB limit is reached in ~548 steps")
    assert fixes == HV.memory_fixes(_view().metrics.memory, LEAK)
    assert extra == {"memory_rank": 0, "memory_growth_per_step": 1000000, "memory_growth_rank": 1}
    full, _, _ = HV.memory_explained(_view(growth=LEAK, source="host", peak_bytes=1_000_000_000,
                                           limit_bytes=1_000_000_000, peak_frac=1.0))
    assert full == f"Memory leak: {LEAK_TEXT} (recent peak 1.0GB is 100% of the 1.0GB limit)"
    unknown, _, _ = HV.memory_explained(_view(growth=LEAK, peak_frac=None))
    assert unknown == f"Memory leak: {LEAK_TEXT}; at this rate the 1.0GB limit is reached in ~548 steps"


def test_memory_is_critical_after_an_oom_or_at_its_limit():
    assert HV.memory_severity(_view(peak_frac=1.0)) == "crit" and HV.memory_severity(_view(ooms=1)) == "crit"
    assert HV.memory_severity(_view(peak_frac=0.99)) == "warn"


def test_a_crashed_outcome_without_a_crash_says_only_that():
    assert HV.Crashed().explain(_view(), None, (), {}) == ("Crashed", [], {})
