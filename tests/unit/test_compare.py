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
from probe import wire
from probe.paths import base_name
from probe.recording import RecordingWriter
from tests.helpers import records as R
from tests.unit.verdict_synth import T0, Rank, hello
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
