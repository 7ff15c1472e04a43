"""``perfmon export --trace``: Chrome trace JSON that viewers load, sized for hours of training."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from probe import paths, wire
from probe.recording import RecordingWriter
from tests.tui import scenarios
from tui.export.trace import DETAIL_STEPS, MAX_SAMPLES, trace_events, write_trace
from tui.stream.sources import load_recordings

REQUIRED = {"X": {"name", "ts", "dur", "pid", "tid"}, "C": {"name", "ts", "pid", "args"},
            "i": {"name", "ts", "pid", "tid", "s"}, "M": {"name", "pid", "args"}, "B": {"name", "ts", "pid", "tid"},
            "E": {"ts", "pid", "tid"}}


def _valid(events: list[dict]) -> None:
    for e in events:
        assert REQUIRED[e["ph"]] <= e.keys(), e
        if "ts" in e:
            assert isinstance(e["ts"], int) and e["ts"] >= 0, e
        if e["ph"] == "X":
            assert isinstance(e["dur"], int) and e["dur"] >= 0, e


def _write(directory: Path, ranks: int, steps: int) -> Path:
    encoder = wire.Encoder()
    for rank in range(ranks):
        records = [{"k": "hello", "t": 1000.0, "proto": [1, 1], "job": "long", "rank": rank, "host": "n1",
                    "pid": 100 + rank, "restart": 0, "name": f"long.r{rank}.x0.p{100 + rank}"}]
        t = 1000.0
        for i in range(steps):
            records.append({"k": "step", "t": t + 0.1, "step": i, "start": t, "dur": 0.1, "gap": 0.0,
                            "phases": {"data": 0.01, "forward": 0.03, "backward": 0.05, "optimizer": 0.01},
                            "comm": {"seconds": 0.02, "exposed": 0.004}})
            t += 0.1
        records.append({"k": "event", "t": t, "name": "checkpoint", "seconds": 2.0})
        writer = RecordingWriter(directory / f"long.r{rank}.x0.p{100 + rank}{paths.RECORD_SUFFIX}")
        writer.write(b"".join(RecordingWriter.wrap(encoder.frame(r)) for r in records))
        writer.close()
    return directory


@pytest.mark.slow
def test_a_two_rank_recording_becomes_a_process_per_rank_with_steps_and_phases(tmp_path):
    out = tmp_path / "trace.json"
    result = subprocess.run([sys.executable, "-m", "tui.cli", "export", "--trace", str(out),
                             str(scenarios.write("healthy", tmp_path))], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    events = json.loads(out.read_text())["traceEvents"]
    _valid(events)
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert sorted(names.values()) == [f"rank 0 ({scenarios.HOST})", f"rank 1 ({scenarios.HOST})"]
    steps = [e for e in events if e["ph"] == "X" and e["name"].startswith("step ")]
    phases = [e for e in events if e["ph"] == "X" and e["name"] in ("data", "forward", "backward", "optimizer")]
    counters = [e for e in events if e["ph"] == "C"]
    assert steps and phases and len(counters) == len(steps)
    first = min(steps, key=lambda e: (e["pid"], e["ts"]))
    inside = [p for p in phases if p["pid"] == first["pid"] and first["ts"] <= p["ts"] < first["ts"] + first["dur"]]
    assert sum(p["dur"] for p in inside) <= first["dur"] + len(inside)       # nested, rounding aside


def _slices(events: list[dict]) -> dict[int, list[int]]:
    """Rank (pid) -> the step numbers that have a slice, in order."""
    out: dict[int, list[int]] = {}
    for e in events:
        if e["ph"] == "X" and e["name"].startswith("step "):
            out.setdefault(e["pid"], []).append(int(e["name"].split()[1]))
    return out


def test_ten_thousand_steps_keep_the_counter_whole_and_slice_the_last_2000_steps(tmp_path):
    loaded = load_recordings(_write(tmp_path, ranks=2, steps=10_000))
    document, size = write_trace(loaded, tmp_path / "long.json")
    parsed = json.loads((tmp_path / "long.json").read_text())
    events = parsed["traceEvents"]
    _valid(events)
    assert size < 2 * 1_600_000, size       # per rank: 0.5 MB of counter, 2,000 steps of slices
    assert _slices(events) == {0: list(range(8000, 10_000)), 1: list(range(8000, 10_000))}
    assert DETAIL_STEPS == 2000
    phases = [e for e in events if e["ph"] == "X" and e["name"] in ("data", "forward", "backward", "optimizer")]
    assert len(phases) == 2 * 2000 * 4
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "thread_name" and e["tid"] == 1}
    assert names == {0: "steps 8000:10000", 1: "steps 8000:10000"}
    assert parsed["otherData"] == document["otherData"] == {
        "perfmon_step_slices": "8000:10000",
        "perfmon_step_slices_chosen_by": "default: the most recent 2000; --steps A:B picks others",
        "perfmon_sliced_steps": 4000, "perfmon_steps": 20_000, "perfmon_counter": "every step of the run"}
    counters = [e for e in events if e["ph"] == "C"]
    assert len(counters) == 2 * MAX_SAMPLES                 # two steps a sample beyond MAX_SAMPLES steps
    assert min(c["ts"] for c in counters) == 0 and max(c["ts"] for c in counters) == 9998 * 100_000
    assert counters[0]["args"] == {"data": 10, "forward": 30, "backward": 50, "optimizer": 10, "comm": 4}
    assert [e["name"] for e in events if e["ph"] == "i"] == ["checkpoint", "checkpoint"]
    _, gz_size = write_trace(loaded, tmp_path / "long.json.gz")
    assert gz_size < size / 5 and json.loads(gzip.decompress((tmp_path / "long.json.gz").read_bytes()))


def test_steps_a_b_on_the_command_line_picks_the_sliced_steps_and_the_metadata_says_so(tmp_path, capsys):
    from tui import cli
    (tmp_path / "rec").mkdir()
    recordings = _write(tmp_path / "rec", ranks=2, steps=10_000)
    out = tmp_path / "mid.json"
    assert cli.main(["export", "--trace", str(out), "--steps", "100:300", str(recordings)]) == 0
    parsed = json.loads(out.read_text())
    assert _slices(parsed["traceEvents"]) == {0: list(range(100, 300)), 1: list(range(100, 300))}
    assert parsed["otherData"]["perfmon_step_slices"] == "100:300"
    assert parsed["otherData"]["perfmon_step_slices_chosen_by"] == "--steps"
    assert parsed["otherData"]["perfmon_sliced_steps"] == 400
    assert "step slices for 400 of 20000 steps, steps 100:300 (--steps)" in capsys.readouterr().err
    assert cli.main(["export", "--trace", str(out), "--steps", "9990:", str(recordings)]) == 0
    assert _slices(json.loads(out.read_text())["traceEvents"]) == {0: list(range(9990, 10_000)),
                                                                  1: list(range(9990, 10_000))}
    assert cli.main(["export", "--trace", str(out), "--steps", ":3", str(recordings)]) == 0
    assert _slices(json.loads(out.read_text())["traceEvents"]) == {0: [0, 1, 2], 1: [0, 1, 2]}


@pytest.mark.parametrize("bad", ["300:100", "5:5", "abc", ":", "7", "-2:5", "1:x"])
def test_a_bad_steps_range_is_one_line_and_exit_2_and_writes_nothing(tmp_path, capsys, bad):
    from tui import cli
    capsys.readouterr()
    out = tmp_path / "bad.json"
    assert cli.main(["export", "--trace", str(out), f"--steps={bad}", str(_write(tmp_path, ranks=1, steps=3))]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"perfmon export: --steps {bad}: expected A:B") and err.count("\n") == 1
    assert not out.exists()


def test_a_long_pause_between_steps_is_a_slice_and_short_ones_are_not(tmp_path):
    rec = load_recordings(_write(tmp_path, ranks=1, steps=3))[0]
    rec.records[2] = dict(rec.records[2], dur=2.6, gap=2.5)      # step 1 waited 2.5 s before it began
    events = trace_events([rec])
    pauses = [e for e in events if e["ph"] == "X" and e["name"] == "between steps"]
    assert [(p["dur"]) for p in pauses] == [2_500_000]
    assert DETAIL_STEPS >= 3


def _checkpointed(directory: Path) -> Path:
    """One rank: steps without ``gap``, a 2.5 s checkpoint before step 3 and a 4 s one (longer
    than the step after it) before step 6."""
    records = [{"k": "hello", "t": 1000.0, "proto": [1, 1], "job": "ckpt", "rank": 0, "host": "n1", "pid": 7,
                "restart": 0}]
    t = 1000.0
    for i in range(8):
        seconds = {3: 2.5, 6: 4.0}.get(i)
        if seconds:
            records.append({"k": "event", "t": t, "name": "checkpoint", "seconds": seconds})
        dur = 0.1 + (seconds or 0.0) if i != 6 else 3.0     # step 6 reports less than the pause before it
        records.append({"k": "step", "t": t + dur, "step": i, "start": t, "dur": dur,
                        "phases": {"forward": 0.04, "backward": 0.06}})
        t += dur
    encoder = wire.Encoder()
    writer = RecordingWriter(directory / f"ckpt.r0.x0.p7{paths.RECORD_SUFFIX}")
    writer.write(b"".join(RecordingWriter.wrap(encoder.frame(r)) for r in records))
    writer.close()
    return directory


def test_a_steps_gap_in_the_trace_is_the_run_models_gap_after_a_checkpoint(tmp_path):
    from perfmon_analysis.runmodel import RunModel
    loaded = load_recordings(_checkpointed(tmp_path))
    model = RunModel()
    for rec in loaded:
        for r in rec.records:
            model.ingest(str(rec.path), r)
    bars = {b.step: b.gap for b in model.view().traces[0].steps}
    assert bars[3] == 2.5 and bars[6] == 3.0 and bars[2] == 0.0      # the model's own gaps (clamped to dur)
    events = trace_events(loaded)
    pauses = {e["ts"]: e["dur"] for e in events if e["name"] == "between steps"}
    steps = {int(e["name"].split()[1]): e for e in events if e["ph"] == "X" and e["name"].startswith("step ")}
    starts = sorted(e["ts"] for e in events if e["ph"] == "C")
    assert sorted(pauses.values()) == [round(bars[3] * 1e6), round(bars[6] * 1e6)]
    for step, gap in bars.items():   # each step's slice starts after its gap, ends with the step
        assert steps[step]["ts"] - starts[step] == round(gap * 1e6)
    counters = [e["args"].get("gap") for e in events if e["ph"] == "C"]
    assert counters[3] == 2500 and counters[6] == 3000 and counters[2] is None
