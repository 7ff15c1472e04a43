"""``perfmon report``: JSON contract (schema), text form, recordings (torn, multi-rank, restarted)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from perfmon_analysis.analysis import Analysis
from probe import wire
from probe.paths import base_name
from probe.recording import RecordingWriter
from tests.helpers.reports import REPORT_VALIDATOR, report_and_text, report_of
from tests.unit.verdict_synth import T0, Rank, job, records
from tui import cli

GB = 1 << 30

JOBS = {
    "healthy-cpu": lambda: job(Rank()),
    "warming": lambda: job(Rank(steps=3)),
    "data-preprocessing": lambda: job(Rank(data=0.04, loader_workers=2, loader_cpu=0.9)),
    "imbalance": lambda: job(Rank(0, comm=0.052, exposed=0.05), Rank(1, comm=0.002, exposed=0.0)),
    "gpu-compute": lambda: job(Rank(gpu_util=97, flops=1e12, throttle=["hw_thermal"]), device="cuda",
                               peak=100e12),
    "memory-oom": lambda: job(Rank(extra_records=[{"k": "event", "t": T0 + 2.9, "name": "oom"}])),
    "gaps": lambda: job(Rank(gap=0.03)),
    "empty-hello": lambda: _hello_only(),
}


def _hello_only():
    from perfmon_analysis.runmodel import RunModel
    model = RunModel()
    model.ingest("s", {"k": "hello", "t": T0, "proto": [1, 0]})
    return model


@pytest.mark.parametrize("name", sorted(JOBS))
def test_report_validates_against_the_schema(name):
    report = report_of(JOBS[name]())
    errors = sorted(REPORT_VALIDATOR.iter_errors(report), key=str)
    assert not errors, [e.message for e in errors]
    json.dumps(report, allow_nan=False)


def test_schema_rejects_a_broken_report():
    report = report_of(JOBS["healthy-cpu"]())
    report["metrics"]["data_wait_frac"] = 1.5
    report["verdict"]["bottleneck"] = "slow"
    assert len(list(REPORT_VALIDATOR.iter_errors(report))) == 2


def test_report_fields_follow_the_documented_contract():
    report = report_of(JOBS["data-preprocessing"]())
    assert report["schema"] == "perfmon.report/2" and report["job"] == "synth"
    v = report["verdict"]
    m = report["metrics"]
    assert v["bottleneck"] == "data_preprocessing" and v["path"] == ["memory", "device_busy", "data_wait",
                                                                     "loader_cpu"]
    # the evidence names the metrics it rests on; their values are stated once, in ``metrics``
    assert {"memory.peak_frac", "device_busy", "data_wait_frac", "loader_cpu"} <= set(v["evidence_metrics"])
    assert not {"data_wait_frac", "loader_cpu", "memory_peak_frac"} & set(v["evidence"])
    assert m["data_wait_frac"] == pytest.approx(0.4) and m["loader_cpu"] == 0.9
    assert m["mfu"] is None and m["tokens_per_s"] is None      # unknown is null
    assert m["memory"]["peak_bytes"] == GB and m["memory"]["params_bytes"] is None
    assert report["ranks"][0]["rank"] == 0 and report["ranks"][0]["steps"] == 30


def test_straggler_marked_in_rank_rows():
    report = report_of(JOBS["imbalance"]())
    assert report["verdict"]["straggler_rank"] == 1
    assert [r["straggler"] for r in report["ranks"]] == [False, True]


@pytest.mark.parametrize("name", sorted(JOBS))
def test_text_form_fits_80_columns_and_leads_with_the_verdict(name):
    report, text = report_and_text(JOBS[name]())
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert lines[1].startswith("VERDICT")
    assert report["verdict"]["headline"].split()[0] in text


def test_text_shows_evidence_path_findings_and_rank_rows():
    text = report_and_text(job(Rank(0, comm=0.052, exposed=0.05, pause=0.1, pause_every=5),
                               Rank(1, comm=0.002, exposed=0.0, pause=0.1, pause_every=5)))[1]
    assert "LOAD IMBALANCE" in text and "Evidence:" in text
    flat = " ".join(text.split())
    assert "Path: memory > device_busy > data_wait > comm_exposed > straggler > load_imbalance" in flat
    assert "Finding step_gaps" in text
    rows = [line for line in text.splitlines() if line.strip().startswith(("0 ", "1 "))]
    assert len(rows) == 2 and "straggler" in rows[1]


# -- recordings through the CLI ----------------------------------------------------------------
def _write_recording(directory: Path, recs: list[dict], *, tear: int = 0) -> Path:
    hello = recs[0]
    path = directory / (base_name(hello["job"], hello["rank"], hello["restart"], hello["pid"]) + ".pmrec")
    writer = RecordingWriter(path)
    enc = wire.Encoder()
    writer.write(b"".join(RecordingWriter.wrap(enc.frame(r)) for r in recs))
    writer.close()
    if tear:
        with open(path, "r+b") as fh:
            fh.truncate(os.path.getsize(path) - tear)
    return path


def test_report_on_a_multi_rank_dir_with_a_restarted_worker(tmp_path, capsys):
    _write_recording(tmp_path, records(Rank(0, comm=0.052, exposed=0.05), world=2, bye=True))
    _write_recording(tmp_path, records(Rank(1, pid=501, comm=0.002, exposed=0.0, steps=10), world=2))
    _write_recording(tmp_path, records(Rank(1, pid=777, restart=1, comm=0.002, exposed=0.0), world=2, bye=True))
    assert cli.main(["report", str(tmp_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert not list(REPORT_VALIDATOR.iter_errors(report))
    assert {r["rank"]: r["generation"] for r in report["ranks"]} == {0: 0, 1: 1}
    assert report["previous_generations"] == [{"rank": 1, "pid": 501, "restart": 0}]
    assert "rank_restarted" in [f["id"] for f in report["findings"]]
    assert report["verdict"]["bottleneck"] == "load_imbalance" and report["verdict"]["straggler_rank"] == 1
    assert report["ended"] is True and report["source"]["kind"] == "recording"

    assert cli.main(["report", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "rank 1 had an earlier process (pid 501" in text
    assert max(map(len, text.splitlines())) <= 80


def test_the_facade_over_the_records_gives_the_report_the_command_prints(tmp_path, capsys):
    recs = {0: records(Rank(0, comm=0.052, exposed=0.05), world=2, bye=True),
            1: records(Rank(1, comm=0.002, exposed=0.0), world=2, bye=True)}
    paths = {rank: _write_recording(tmp_path, r) for rank, r in recs.items()}
    assert cli.main(["report", str(tmp_path), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    direct = Analysis.of_records([(str(paths[rank]), r) for rank, r in sorted(recs.items())]).report(
        source=printed["source"])
    assert direct == printed and direct["verdict"]["bottleneck"] == "load_imbalance"


def test_torn_recording_reports_the_intact_part_and_one_line_on_stderr(tmp_path, capsys):
    path = _write_recording(tmp_path, records(Rank(0, steps=30)), tear=7)
    assert cli.main(["report", str(path), "--json"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and "truncated" in err[0] and str(path) in err[0]
    assert report["problems"] and report["verdict"]["bottleneck"] == "healthy"
    assert report["metrics"]["steps"] == 30  # the last sample was torn, every step survived


@pytest.mark.parametrize("argv,message", [
    (["report", "/nonexistent/rec"], "no such file or directory"),
    (["report", "no-such-job"], "no job named 'no-such-job'"),
])
def test_bad_targets_are_one_line_errors(argv, message, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_recording_with_no_ranks_is_a_user_error(tmp_path, capsys):
    path = tmp_path / "x.r0.x0.p1.pmrec"
    RecordingWriter(path).close()
    assert cli.main(["report", str(path)]) == 2
    assert "no records" in capsys.readouterr().err


def test_corrupt_recording_reports_what_came_before_the_damage(tmp_path, capsys):
    path = _write_recording(tmp_path, records(Rank(0, steps=30)))
    data = bytearray(path.read_bytes())
    data[len(data) * 3 // 4] ^= 0xFF           # flip a byte three quarters in
    path.write_bytes(bytes(data))
    assert cli.main(["report", str(path), "--json"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert len(captured.err.strip().splitlines()) == 1 and "corrupt" in captured.err
    assert 10 < report["metrics"]["steps"] < 30 and report["problems"]


def test_sub_millisecond_steps_with_most_time_between_them_are_not_plainly_healthy():
    """pytorch/examples regression/main.py: a tiny model, batches built in the loop between 0.2 ms steps. The
    time between steps recurs on every step: the loop's own work, 60% of the iteration, judged as a loss."""
    report, text = report_and_text(job(Rank(steps=60, dur=0.0005, gap=0.0003)))
    v = report["verdict"]
    assert (v["bottleneck"], v["severity"], v["loss"]) == ("loop_work", "crit", "loop")
    assert v["headline"].startswith("Loop work: 60% of each step is the loop's own work between steps")
    assert report["metrics"]["loop_frac"] == 0.6 and report["metrics"]["ettr"] == 1.0
    row = next(line for line in text.splitlines() if line.strip().startswith("0 "))
    assert row.split()[4:6] == ["500µs", "200µs"] and "0ms" not in text and "0.0s" not in text
    assert "Window: 50 steps, 25ms." in text                      # 50 steps of 500µs
    assert "COMPUTE = step - time between steps - data wait - exposed comm" in text   # why 500µs - 300µs
    assert "Where the step goes (shares of one step: from a step's start to the next's" in " ".join(text.split())


def test_a_cuda_recording_without_utilization_is_never_healthy_ok(tmp_path, capsys):
    """The hello says CUDA, the samples carry no utilization (NVML NotSupported), 60 steps, no loader:
    busy is unknown, so the report lists it and says "not measured", never healthy with severity ok."""
    recs = records(Rank(0, steps=60), device="cuda", peak=100e12)
    for rec in recs:
        if rec["k"] == "sample":     # the GPU is listed, its utilization query answers NotSupported
            rec["gpus"] = [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "util": None, "throttle": []}]
    _write_recording(tmp_path, recs)
    assert cli.main(["report", str(tmp_path), "--json"]) == 0
    verdict = json.loads(capsys.readouterr().out)["verdict"]
    assert "device_busy" in verdict["unknown"]
    assert (verdict["bottleneck"], verdict["severity"]) == ("not_measured", "warn")
