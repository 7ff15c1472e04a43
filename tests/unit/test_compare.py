"""``perfmon compare``: the step-time interval, the decision, what moved, the limits and the exit
codes, on recordings with planted step times written as a probe writes them."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

import jsonschema
import pytest

from perfmon_analysis import compare as cmp
from perfmon_analysis.analysis import Analysis
from perfmon_analysis.losses import Loss
from probe import wire
from probe.paths import base_name
from probe.recording import RecordingWriter
from tests.helpers import records as R
from tests.unit.verdict_synth import T0, Rank, hello, records as job_records
from tui import cli

SCHEMA = json.loads((Path(__file__).parents[2] / "tui" / "schemas" / "compare.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
STEP = 0.010


def noisy(n: int, mean: float, seed: int, sd: float = 0.03, phi: float = 0.0) -> list[float]:
    """``n`` step times around ``mean``: relative noise ``sd``, AR(1) with ``phi`` (slow phases last)."""
    rng, e, out = random.Random(seed), 0.0, []
    for _ in range(n):
        e = phi * e + rng.gauss(0.0, sd * (1 - phi * phi) ** 0.5)
        out.append(mean * (1 + e))
    return out


def run_records(durs: list[float], data: list[float] | None, *, rank: int = 0, world: int = 1,
                pid: int = 1000) -> list[dict]:
    """A CPU rank's records: a step per duration (its loader wait ``data``, None: no loader timed),
    the training thread on CPU for the rest of the body, one sample per step."""
    out, t = [hello(Rank(rank=rank, pid=pid), world, "cpu", None, T0)], T0
    for i, dur in enumerate(durs):
        wait = data[i] if data is not None else 0.0
        phases = {"forward": (dur - wait) / 2, "backward": (dur - wait) / 2}
        if data is not None:
            phases["data"] = wait
        out.append(R.step(i, start=t, dur=dur, phases=phases, samples=32, cpu=dur - wait))
        t += dur
        out.append(R.sample(t, host={"cpu": 1.0, "cpu_count": 8, "rss": 1 << 30, "mem_limit": 16 << 30,
                                     "mem_limit_source": "machine"}))
    out.append({"k": "bye", "t": t + 0.01})
    return out


def write(directory: Path, recs: list[dict]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    first = recs[0]
    path = directory / (base_name(first["job"], first["rank"], first["restart"], first["pid"]) + ".pmrec")
    writer, enc = RecordingWriter(path), wire.Encoder()
    writer.write(b"".join(RecordingWriter.wrap(enc.frame(r)) for r in recs))
    writer.close()
    return path


def loader_run(directory: Path, seed: int, wait: float, n: int = 200) -> Path:
    """A run whose step is STEP of compute (noisy) plus ``wait`` of loader wait per step."""
    compute = noisy(n, STEP, seed)
    return write(directory, run_records([c + wait for c in compute], [wait] * n))


def run_cli(capsys, *argv: str) -> tuple[int, dict | str, str]:
    code = cli.main(["compare", *argv])
    out = capsys.readouterr()
    body = json.loads(out.out) if "--json" in argv and out.out else out.out
    return code, body, out.err


# -- the interval ---------------------------------------------------------------------------------
@pytest.mark.parametrize("df,table", [(2, 4.303), (3, 3.182), (5, 2.571), (10, 2.228), (30, 2.042)])
def test_t_quantile_matches_the_table(df, table):
    assert cmp.t_quantile(0.975, df) == pytest.approx(table, rel=0.01)


def _naive_covers(base: list[float], cand: list[float]) -> bool:
    """A t-interval over single steps, as if they were independent: what the batches are for."""
    se = (statistics.variance(base) / len(base) + statistics.variance(cand) / len(cand)) ** 0.5
    d = statistics.fmean(cand) - statistics.fmean(base)
    return abs(d) <= 1.97 * se


def test_the_interval_covers_no_change_about_95_percent_of_the_time_even_when_slow_phases_last():
    """Same job twice, its steps correlated (a slow phase lasts ~10 steps): the batch interval
    leaves out 0 about 5% of the time; one that treats steps as independent would cry wolf often."""
    covered = naive = 0
    trials = 300
    for seed in range(trials):
        base, cand = noisy(200, STEP, 2 * seed, phi=0.8), noisy(200, STEP, 2 * seed + 1, phi=0.8)
        change = cmp.step_change(base, cand)
        assert isinstance(change, cmp.StepChange)
        covered += not change.significant
        naive += _naive_covers(base, cand)
    assert 0.93 <= covered / trials <= 0.99, covered / trials
    assert naive / trials < 0.75, naive / trials      # the planted error the batches avoid


def test_a_planted_slowdown_is_inside_its_interval_and_significant():
    base, cand = noisy(200, STEP, 1), noisy(200, STEP * 1.3, 2)
    change = cmp.step_change(base, cand)
    assert isinstance(change, cmp.StepChange) and change.significant
    assert change.low < 0.30 < change.high and change.high - change.low < 0.05
    assert cmp.decide(change, 0.10) == "regression" and cmp.decide(change, 0.40) == "no significant change"


def test_one_preempted_step_does_not_move_the_typical_step():
    base = noisy(200, STEP, 1)
    cand = list(base)
    cand[100] = 1.0                    # a 1 s stall: +50% on the mean step, nothing on a batch median
    change = cmp.step_change(base, cand)
    assert isinstance(change, cmp.StepChange) and abs(change.change) < 0.01 and not change.significant


def test_too_few_steps_give_no_interval_and_no_decision():
    change = cmp.step_change(noisy(10, STEP, 1), noisy(200, STEP, 2))
    assert isinstance(change, str) and "baseline has 10 steps past its warm-up" in change
    assert cmp.decide(change, 0.10) == "unknown"


def test_the_slowest_rank_sets_each_steps_time():
    fast, slow = [STEP] * 40, [STEP] * 40
    slow[20] = 3 * STEP
    analysis = Analysis.of_records([("r0", run_records(fast, None, world=2)),
                                    ("r1", run_records(slow, None, rank=1, world=2, pid=1001))])
    steps = cmp.job_steps(analysis.steps_in_window())
    assert len(steps) == 39 and max(s.dur for s in steps) == pytest.approx(3 * STEP)   # step 0 left out


# -- what moved -----------------------------------------------------------------------------------
def test_a_loader_that_got_slow_is_what_moved(tmp_path, capsys):
    """+3 ms of loader wait on a 10 ms step: +30%, all of it data wait, none of it compute."""
    loader_run(tmp_path / "base", 1, 0.0)
    loader_run(tmp_path / "cand", 2, 0.003)
    code, out, _ = run_cli(capsys, str(tmp_path / "base"), str(tmp_path / "cand"), "--json")
    assert code == 0 and not list(VALIDATOR.iter_errors(out))
    assert out["decision"] == "regression"
    assert out["step_time"]["ci_low"] < 0.30 < out["step_time"]["ci_high"]
    top = out["moved"][0]
    assert top["loss"] == "data_wait" and top["metric"] == "data_wait_frac"
    assert top["points"] == pytest.approx(0.30, abs=0.02)
    assert abs(out["rest_points"]) < 0.02
    assert out["summary"].startswith("regression: step time +") and "data wait +30 pts" in out["summary"]
    rows = {r["name"]: r for r in out["metrics"]}
    assert rows["data_wait_frac"]["change"] == pytest.approx(0.23, abs=0.01)     # 0% -> 3/13 of the step
    assert rows["samples_per_s"]["change"] < -0.2 and rows["samples_per_s"]["worse"] == "down"


def test_a_loss_measured_in_one_run_only_is_unknown_not_zero(tmp_path, capsys):
    write(tmp_path / "base", run_records(noisy(200, STEP, 1), None))            # no loader timed
    loader_run(tmp_path / "cand", 2, 0.003)
    code, out, _ = run_cli(capsys, str(tmp_path / "base"), str(tmp_path / "cand"), "--json")
    assert code == 0 and not list(VALIDATOR.iter_errors(out))
    data = next(m for m in out["moved"] if m["loss"] == "data_wait")
    assert data["points"] is None and data["baseline_share"] is None and data["why_unknown"].startswith("baseline:")
    assert out["moved"][-1] is data and out["rest_points"] is None


# -- decision, limits and exit codes --------------------------------------------------------------
def test_the_same_job_twice_is_no_significant_change_and_exits_0(tmp_path, capsys):
    loader_run(tmp_path / "a", 1, 0.001)
    loader_run(tmp_path / "b", 2, 0.001)
    code, out, err = run_cli(capsys, str(tmp_path / "a"), str(tmp_path / "b"), "--json", "--max-regression", "10")
    assert code == 0 and out["decision"] == "no significant change" and err == ""
    assert out["limits"] == [{"metric": "step_time", "limit": 0.1, "value": out["step_time"]["change"],
                              "status": "ok"}]


def test_a_regression_over_the_limit_exits_1_and_one_under_it_exits_0(tmp_path, capsys):
    loader_run(tmp_path / "fast", 1, 0.0)
    loader_run(tmp_path / "slow", 2, 0.003)
    fast, slow = str(tmp_path / "fast"), str(tmp_path / "slow")
    assert run_cli(capsys, fast, slow, "--max-regression", "10")[0] == 1
    assert run_cli(capsys, fast, slow, "--max-regression", "40")[0] == 0
    assert run_cli(capsys, slow, fast, "--max-regression", "10")[0] == 0            # faster is no regression
    code, out, _ = run_cli(capsys, slow, fast, "--json")
    assert out["decision"] == "improvement" and out["moved"][0]["points"] == pytest.approx(-0.23, abs=0.02)


def test_the_limit_holds_under_the_noise_floor(tmp_path, capsys):
    """A significant 4% slowdown is below --min-change (not called a regression) yet over a 2% limit."""
    write(tmp_path / "a", run_records(noisy(400, STEP, 1, sd=0.005), [0.0] * 400))
    write(tmp_path / "b", run_records(noisy(400, STEP * 1.04, 2, sd=0.005), [0.0] * 400))
    code, out, _ = run_cli(capsys, str(tmp_path / "a"), str(tmp_path / "b"), "--json", "--max-regression", "2")
    assert out["decision"] == "no significant change" and out["step_time"]["ci_low"] > 0.02
    assert code == 1 and out["over_limit"]


def test_per_metric_limits_in_points_for_shares(tmp_path, capsys):
    loader_run(tmp_path / "base", 1, 0.0)
    loader_run(tmp_path / "cand", 2, 0.003)
    base, cand = str(tmp_path / "base"), str(tmp_path / "cand")
    code, out, _ = run_cli(capsys, base, cand, "--json", "--limit", "data_wait_frac=20")
    check = out["limits"][0]
    assert code == 1 and check["status"] == "over" and check["value"] == pytest.approx(0.23, abs=0.01)
    assert run_cli(capsys, base, cand, "--limit", "data_wait_frac=30")[0] == 0
    assert run_cli(capsys, base, cand, "--limit", "samples_per_s=10")[0] == 1       # throughput fell ~23%


def test_a_limit_on_an_unmeasured_quantity_says_so_and_does_not_decide(tmp_path, capsys):
    loader_run(tmp_path / "base", 1, 0.0)
    loader_run(tmp_path / "cand", 2, 0.0)
    code, out, err = run_cli(capsys, str(tmp_path / "base"), str(tmp_path / "cand"), "--json", "--limit", "mfu=1")
    assert code == 0 and out["limits"][0]["status"] == "unknown"
    assert err.strip() == "perfmon compare: limit on mfu not checked: not measured in both runs"


def test_too_short_a_run_cannot_fail_the_step_limit(tmp_path, capsys):
    loader_run(tmp_path / "base", 1, 0.0, n=20)
    loader_run(tmp_path / "cand", 2, 0.003)
    code, out, err = run_cli(capsys, str(tmp_path / "base"), str(tmp_path / "cand"), "--json",
                             "--max-regression", "10")
    assert code == 0 and out["decision"] == "unknown" and not list(VALIDATOR.iter_errors(out))
    assert "step_time not checked" in err and "an interval needs 15" in err


@pytest.mark.parametrize("extra,message", [
    (["--max-regression", "-1"], "--max-regression -1.0: must be 0 or more"),
    (["--limit", "nonsense=3"], "--limit nonsense=3: expected NAME=VALUE"),
    (["--limit", "data_wait_frac=lots"], "'lots' is not a number"),
    (["--warmup", "-2"], "--warmup -2: must be 0 or more"),
])
def test_bad_options_are_one_line_errors(tmp_path, capsys, extra, message):
    loader_run(tmp_path / "a", 1, 0.0, n=20)
    code, _, err = run_cli(capsys, str(tmp_path / "a"), str(tmp_path / "a"), *extra)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_a_missing_run_is_a_one_line_error(tmp_path, capsys):
    loader_run(tmp_path / "a", 1, 0.0, n=20)
    code, _, err = run_cli(capsys, str(tmp_path / "a"), str(tmp_path / "nope"))
    assert code == 2 and "no such file or directory" in err and len(err.strip().splitlines()) == 1


def test_text_leads_with_the_decision_and_fits_80_columns(tmp_path, capsys):
    loader_run(tmp_path / "base", 1, 0.0)
    loader_run(tmp_path / "cand", 2, 0.003)
    code, text, _ = run_cli(capsys, str(tmp_path / "base"), str(tmp_path / "cand"), "--max-regression", "10")
    assert code == 1 and text.startswith("perfmon compare: regression: step time +")
    assert "data wait" in text and "step_time: +" in text and "OVER" in text
    assert all(len(line) <= 80 for line in text.splitlines() if not line.lstrip().startswith("from "))


# -- exact figures on planted runs (no noise: every step of a run takes the same time) --------------
def _steady(dur: float, wait: float | None, n: int = 30) -> Analysis:
    """A whole run of ``n`` steps of ``dur`` each, ``wait`` of it loader wait (None: no loader timed)."""
    return Analysis.of_records([("s", run_records([dur] * n, None if wait is None else [wait] * n))],
                               window_steps=cmp.STEP_BUFFER, window_seconds=float("inf"))


SOURCES = ({"kind": "recording", "paths": ["/runs/base/r0.pmrec", "/runs/base/r1.pmrec"]}, {"kind": "live"})


def _half_again_slower(**kwargs) -> dict:
    """30 steps of 0.5 s (0.1 s of them loader wait) against 40 of 0.75 s (0.35 s): +50%, all of it data wait."""
    return cmp.compare(_steady(0.5, 0.1), _steady(0.75, 0.35, n=40), sources=SOURCES, **kwargs)


def test_a_run_half_as_slow_again_is_a_50_percent_regression_all_of_it_data_wait():
    out = _half_again_slower(max_regression=0.5, limits={"data_wait_frac": 0.3, "ettr": 0.0, "mfu": 0.01})
    assert not list(VALIDATOR.iter_errors(out))
    assert out["decision"] == "regression"
    # 30 and 40 steps less the 10 of warm-up, the first of them only partly in the window: 19 and 29
    assert out["step_time"] == {"statistic": "mean of batch medians", "baseline_s": 0.5, "candidate_s": 0.75,
                                "change": 0.5, "ci_low": 0.5, "ci_high": 0.5, "confidence": 0.95,
                                "method": "batch medians, Welch t", "steps": [19, 29], "batches": [3, 5]}
    assert out["moved"][0] == {"loss": "data_wait", "label": "data wait", "metric": "data_wait_frac",
                               "baseline_share": 0.2, "candidate_share": 0.466667, "points": 0.5}
    assert out["rest_points"] == 0.0
    rows = {r["name"]: r for r in out["metrics"]}
    assert rows["step_time_median_s"] == {"name": "step_time_median_s", "label": "step time (median)",
                                          "baseline": 0.5, "candidate": 0.75, "change": 0.5,
                                          "change_in": "relative", "worse": "up"}
    assert rows["data_wait_frac"] == {"name": "data_wait_frac", "label": "data wait", "baseline": 0.2,
                                      "candidate": 0.466667, "change": 0.266667, "change_in": "points",
                                      "worse": "up"}
    assert rows["samples_per_s"]["change"] == -0.333333 and rows["tokens_per_s"]["change"] is None
    # a slowdown exactly at its limit is within it, and so is a share that did not move under a 0 limit
    assert out["limits"] == [
        {"metric": "step_time", "limit": 0.5, "value": 0.5, "status": "ok"},
        {"metric": "data_wait_frac", "limit": 0.3, "value": 0.266667, "status": "ok"},
        {"metric": "ettr", "limit": 0.0, "value": 0.0, "status": "ok"},
        {"metric": "mfu", "limit": 0.01, "value": None, "status": "unknown", "why": "not measured in both runs"}]
    assert out["over_limit"] is False
    assert {k: out["baseline"][k] for k in ("job", "world_size", "device", "steps", "bottleneck", "source")} == \
        {"job": "synth", "world_size": 1, "device": "cpu", "steps": 19, "bottleneck": "data_loading",
         "source": SOURCES[0]}
    assert out["baseline"]["headline"].startswith("Data loading: 20% of each step waits for the loader")
    assert out["candidate"]["headline"].startswith("Data loading: 47% of each step waits for the loader")
    assert out["candidate"]["source"] == SOURCES[1]
    assert out["summary"] == "regression: step time +50.0% (95% CI +50.0% to +50.0%): data wait +50 pts"


def test_past_its_limits_the_comparison_is_over():
    out = _half_again_slower(max_regression=0.4, limits={"samples_per_s": 0.2})
    assert out["limits"] == [{"metric": "step_time", "limit": 0.4, "value": 0.5, "status": "over"},
                             {"metric": "samples_per_s", "limit": 0.2, "value": 0.333333, "status": "over"}]
    assert out["over_limit"] is True


def test_the_text_report_is_the_summary_the_runs_the_table_what_moved_and_the_limits():
    out = _half_again_slower(max_regression=0.5, limits={"data_wait_frac": 0.3, "mfu": 0.01})
    assert cmp.render_text(out).splitlines() == [
        "perfmon compare: regression: step time +50.0% (95% CI +50.0% to +50.0%): data",
        "    wait +50 pts",
        "",
        " baseline: synth, 19 steps, verdict DATA LOADING",
        "           from /runs/base/r0.pmrec and 1 more",
        "candidate: synth, 29 steps, verdict DATA LOADING",
        "           from live",
        "typical step: 500ms -> 750ms (means of 3 and 5 batch medians)",
        "a regression or an improvement: a significant change of 10% or more",
        "",
        "                                    baseline     candidate      change",
        "step time (median)                     500ms         750ms        +50%",
        "samples/s                               64/s        42.7/s        -33%",
        "tokens/s                                 n/a           n/a",
        "MFU                                      n/a           n/a",
        "ETTR                                    100%          100%      +0 pts",
        "memory peak                            1.1GB         1.1GB         +0%",
        "device busy                              80%           53%     -27 pts",
        "loader CPU per worker                    n/a           n/a",
        "loader workers                           n/a           n/a",
        "data wait                                20%           47%     +27 pts",
        "exposed communication                     0%            0%      +0 pts",
        "waiting, no measured cause                0%            0%      +0 pts",
        "loop work between steps                   0%            0%      +0 pts",
        "pauses between steps                      0%            0%      +0 pts",
        "",
        "what moved (points of the baseline's typical step):",
        "  data wait                          +50 pts",
        "  exposed communication               +0 pts",
        "  waiting, no measured cause          +0 pts",
        "  loop work between steps             +0 pts",
        "  pauses between steps                +0 pts",
        "  compute and the rest                +0 pts",
        "",
        "limits:",
        "  step_time: +50% worse, limit +50%: OK",
        "  data_wait_frac: +27 pts worse, limit +30 pts: OK",
        "  mfu: n/a worse, limit +1 pts: UNKNOWN (not measured in both runs)",
    ]


def test_a_loss_timed_in_the_baseline_only_has_no_change_and_says_why():
    out = cmp.compare(_steady(0.5, 0.1), _steady(0.5, None), sources=SOURCES)
    data = next(m for m in out["moved"] if m["loss"] == "data_wait")
    assert data["points"] is None and data["baseline_share"] == 0.2 and data["candidate_share"] is None
    assert data["why_unknown"].startswith("candidate: ") and out["rest_points"] is None
    row = next(r for r in out["metrics"] if r["name"] == "data_wait_frac")
    assert (row["baseline"], row["candidate"], row["change"]) == (0.2, None, None)
    text = cmp.render_text(out).splitlines()
    assert "data wait                                20%           n/a" in text
    assert text[-4:] == [
        "  data wait                              n/a  (candidate: no batch fetch timed",
        "    (mon.loader(...), a DataLoader under perfmon run or a trainer callback) or",
        "    no step timing yet)",
        "  compute and the rest                   n/a",
    ]


def test_the_text_of_an_unknown_step_time_shows_no_typical_step_and_wraps_to_its_width():
    result = {
        "summary": "step time change unknown: the baseline has 3 steps past its warm-up; an interval needs 15",
        "baseline": {"job": None, "steps": 3, "bottleneck": "healthy", "source": {"kind": "live"}},
        "candidate": {"job": "j", "steps": 40, "bottleneck": "healthy",
                      "source": {"paths": ["/a/very/long/directory/name/that/goes/on/and/on/rank0.pmrec"]}},
        "step_time": {"why_unknown": "the baseline has 3 steps past its warm-up; an interval needs 15"},
        "min_change": 0.1, "moved": [], "rest_points": None, "limits": [],
        "metrics": [
            {"name": "loader_cpu", "label": "loader CPU per worker", "baseline": 0.5, "candidate": 1.25,
             "change": 1.5, "change_in": "relative", "worse": None},
            {"name": "loader_workers", "label": "loader workers", "baseline": 4, "candidate": 8, "change": 1.0,
             "change_in": "relative", "worse": None},
            {"name": "memory_peak_bytes", "label": "a label longer than the thirty columns it has",
             "baseline": 2.5e9, "candidate": None, "change": None, "change_in": "relative", "worse": "up"},
        ],
    }
    assert cmp.render_text(result, width=60).splitlines() == [
        "perfmon compare: step time change unknown: the baseline has",
        "    3 steps past its warm-up; an interval needs 15",
        "",
        " baseline: n/a, 3 steps, verdict HEALTHY",
        "           from live",
        "candidate: j, 40 steps, verdict HEALTHY",
        "           from /a/very/long/directory/name/that/goes/on/and/on/rank0.pmrec",      # a path is whole
        "",
        "                                    baseline     candidate",
        "    change",
        "loader CPU per worker                    50%          125%",
        "    +150%",
        "loader workers                             4             8",
        "    +100%",
        "a label longer than the thirty         2.5GB           n/a",
    ]


def test_the_summary_names_what_moved_by_two_points_or_more_and_a_changed_verdict():
    def result(decision: str, moved: list[float | None], rest: float | None, verdicts=("healthy", "healthy")) -> dict:
        return {"decision": decision, "step_time": {"change": 0.123, "ci_low": 0.101, "ci_high": 0.145},
                "moved": [{"label": f"loss {i}", "points": p} for i, p in enumerate(moved)], "rest_points": rest,
                "baseline": {"bottleneck": verdicts[0]}, "candidate": {"bottleneck": verdicts[1]}}

    assert cmp.summary(result("regression", [0.02, 0.0199, None, -0.05], 0.02)) == \
        "regression: step time +12.3% (95% CI +10.1% to +14.5%): loss 0 +2 pts, loss 3 -5 pts, " \
        "compute and the rest +2 pts"
    assert cmp.summary(result("regression", [0.0199], -0.0199)) == \
        "regression: step time +12.3% (95% CI +10.1% to +14.5%)"
    # no significant change: what moved is noise, not named; a changed verdict is
    assert cmp.summary(result("no significant change", [0.05], 0.05, ("healthy", "data_loading"))) == \
        "no significant change: step time +12.3% (95% CI +10.1% to +14.5%); verdict HEALTHY -> DATA LOADING"
    assert cmp.summary({"step_time": {"why_unknown": "too short"}}) == "step time change unknown: too short"


def test_a_run_of_exactly_the_fewest_steps_has_an_interval_and_one_short_of_it_says_which_run():
    assert isinstance(cmp.step_change([STEP] * 15, [STEP] * 15), cmp.StepChange)
    assert cmp.step_change([STEP] * 15, [STEP] * 14) == \
        "the candidate has 14 steps past its warm-up; an interval needs 15"


def test_runs_without_spread_have_a_point_interval():
    change = cmp.step_change([0.5] * 20, [0.75] * 20)
    assert change == cmp.StepChange(0.5, 0.75, 0.5, 0.5, 0.5, (20, 20), (4, 4))


def test_the_interval_is_welchs_over_the_batch_medians():
    base = [0.9] * 5 + [1.0] * 5 + [1.1] * 5            # batch medians 0.9, 1.0, 1.1
    cand = [1.1] * 5 + [1.2] * 5 + [1.3] * 5
    change = cmp.step_change(base, cand)
    assert isinstance(change, cmp.StepChange) and change.batches == (3, 3)
    # equal spreads over 3 batches each: 4 degrees of freedom, the standard error sqrt(2 x 0.01 / 3)
    half = cmp.t_quantile(0.975, 4) * (2 * 0.01 / 3) ** 0.5
    assert (change.change, change.low, change.high) == pytest.approx((0.2, 0.2 - half, 0.2 + half), rel=1e-9)
    # one run without spread: the other's 2 degrees of freedom
    change = cmp.step_change([1.0] * 15, cand)
    half = cmp.t_quantile(0.975, 2) * (0.01 / 3) ** 0.5
    assert isinstance(change, cmp.StepChange)
    assert (change.low, change.high) == pytest.approx((0.2 - half, 0.2 + half), rel=1e-9)


def test_batches_are_contiguous_and_as_even_as_the_steps_allow():
    assert cmp.batch_medians([float(i) for i in range(17)]) == [2.0, 7.5, 13.5]     # 5, 6 and 6 steps


def test_t_quantile_is_the_cornish_fisher_series_to_the_fourth_order():
    """Abramowitz & Stegun 26.7.5 through g4: at its lowest degrees of freedom the series is a little
    under the table (4.303, 3.182), within the 1% the docstring promises."""
    assert cmp.t_quantile(0.975, 2) == pytest.approx(4.2705513419, abs=1e-9)
    assert cmp.t_quantile(0.975, 3) == pytest.approx(3.1786169951, abs=1e-9)


def test_a_change_exactly_at_the_least_change_is_called():
    slower = cmp.StepChange(1.0, 1.5, 0.5, 0.5, 0.5, (20, 20), (4, 4))
    faster = cmp.StepChange(1.0, 0.5, -0.5, -0.5, -0.5, (20, 20), (4, 4))
    assert cmp.decide(slower, 0.5) == "regression" and cmp.decide(faster, 0.5) == "improvement"


def test_each_loss_moves_by_its_seconds_in_points_of_the_baseline_step_largest_first():
    base = (Loss("data_wait", "data wait", 0.2, "timed"), Loss("comm_exposed", "comm", 0.1, "timed"),
            Loss("loop", "loop", None, "not timed in the baseline"), Loss("gone", "only here", 0.3, "timed"),
            Loss("step_gaps", "pauses", 0.05, "timed"))
    cand = (Loss("data_wait", "data wait", 0.4, "timed"), Loss("comm_exposed", "comm", 0.05, "timed"),
            Loss("loop", "loop", 0.1, "timed"), Loss("step_gaps", "pauses", 0.1, "timed"))
    change = cmp.StepChange(1.0, 1.25, 0.25, 0.2, 0.3, (20, 20), (4, 4))
    moved, rest = cmp.attribute(base, cand, change)
    # 0.2 s of a 1 s step to 0.4 of 1.25 s: +30 points; comm 0.1 s to 0.0625 s; pauses 0.05 s to 0.125 s
    assert [(m.loss, m.baseline, m.candidate, m.points, m.why_unknown) for m in moved] == [
        ("data_wait", 0.2, 0.4, pytest.approx(0.3), None),
        ("step_gaps", 0.05, 0.1, pytest.approx(0.075), None),
        ("comm_exposed", 0.1, 0.05, pytest.approx(-0.0375), None),
        ("loop", None, 0.1, None, "baseline: not timed in the baseline")]
    assert rest is None                                  # a loss unknown: the rest is unknown too
    moved, rest = cmp.attribute(base[:2] + base[3:], cand, change)
    assert len(moved) == 3 and rest == pytest.approx(0.25 - 0.3 - 0.075 + 0.0375)


def test_limits_are_percent_or_points_and_a_bad_one_is_named():
    assert cmp.parse_limits(["data_wait_frac=5%", "samples_per_s=12.5"]) == {"data_wait_frac": 0.05,
                                                                             "samples_per_s": 0.125}
    with pytest.raises(ValueError, match="^--limit data_wait_frac=1=2: '1=2' is not a number$"):
        cmp.parse_limits(["data_wait_frac=1=2"])
    with pytest.raises(ValueError) as bad:
        cmp.parse_limits(["speed=3"])
    assert str(bad.value) == f"--limit speed=3: expected NAME=VALUE, NAME one of {', '.join(cmp.limitable())}"


def test_a_whole_run_analysis_holds_every_step_the_model_keeps():
    assert cmp.whole_run().window == (cmp.STEP_BUFFER, float("inf"))


def test_both_unknown_a_losss_why_names_both_runs():
    change = cmp.StepChange(1.0, 1.25, 0.25, 0.2, 0.3, (20, 20), (4, 4))
    moved, _ = cmp.attribute((Loss("loop", "loop", None, "no steps yet"),),
                             (Loss("loop", "loop", None, "not timed"),), change)
    assert moved[0].why_unknown == "baseline: no steps yet; candidate: not timed"


def test_a_relative_change_from_zero_is_unknown():
    assert cmp._change("samples_per_s", 0.0, 5.0) is None
    assert cmp._change("samples_per_s", 4.0, 5.0) == 0.25 and cmp._change("data_wait_frac", 0.25, 0.5) == 0.25


def test_a_run_without_steps_compares_as_unknown():
    empty = Analysis.of_records([("e", [hello(Rank(), 1, "cpu", None, T0)])], window_steps=cmp.STEP_BUFFER,
                                window_seconds=float("inf"))
    out = cmp.compare(empty, _steady(0.5, 0.1))
    assert out["decision"] == "unknown" and out["baseline"]["steps"] == 0
    assert out["step_time"] == {"why_unknown": "the baseline has 0 steps past its warm-up; an interval needs 15"}
    # nor does an analysis that holds no rank at all
    nothing = cmp.compare(cmp.whole_run(), _steady(0.5, 0.1))
    assert (nothing["decision"], nothing["baseline"]["steps"], nothing["baseline"]["job"]) == ("unknown", 0, None)
    # no source given: nothing after "from"
    assert cmp.render_text(out).splitlines()[3:5] == [" baseline: synth, 0 steps, verdict WARMING UP",
                                                      " " * 11 + "from "]


def test_the_tables_loss_rows_are_labelled_as_the_baselines_verdict_labels_them():
    gpu = Analysis.of_records([("g", job_records(Rank(steps=40, gpu_util=60.0), device="cuda"))],
                              window_steps=cmp.STEP_BUFFER, window_seconds=float("inf"))
    out = cmp.compare(_steady(0.1, 0.01, n=40), gpu)
    idle = next(r for r in out["metrics"] if r["name"] == "device_idle_frac")
    assert idle["label"] == "waiting, no measured cause"        # a CPU job's; the GPU's is "device idle, ..."
