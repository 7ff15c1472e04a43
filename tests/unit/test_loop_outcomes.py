"""The verdict's outcomes for the loop's own work between steps (perfmon_analysis.loop_outcomes): a
wait, the next batch built on the training thread, other work; each headline and its fixes, golden,
with the stack sample line that says where and without one."""

from __future__ import annotations

from perfmon_analysis.verdict import Verdict, evaluate
from tests.unit.verdict_synth import T0, Rank, between, job

WAIT_FIXES = ["take the wait off the training thread: hand the work to a background thread or process through a "
              "queue, so the next step starts at once",
              "a lock shared with another thread: hold it only to swap a buffer, never while writing out",
              "do it every N steps instead of every step"]
WORK_FIXES = ["do it every N steps instead of every step (logging, metrics, validation of the batch)",
              "hand it to a background thread or process through a queue; keep the training thread stepping",
              "keep metrics on the device and read them every N steps"]


def _between(line: int, state: str, before: int) -> Verdict:
    """30 ms of a 100 ms step between steps, its 20 stack samples all at train.py:``line``."""
    return evaluate(job(Rank(gap=0.03, extra_records=[between(T0, T0 + 3.0, [(line, state, 20, before)])])).view())


def test_a_wait_between_steps_names_its_line():
    v = _between(33, "waiting", 0)
    assert (v.bottleneck, v.headline) == \
        ("host_wait", "Host wait: 30% of each step waits between steps, most in train at train.py:33 in train (30%)")
    assert v.suggestions == ["start with train at train.py:33 in train: 30% ± 2% of each step waits there between "
                             "steps (key u: every line)", *WAIT_FIXES]
    assert v.evidence["where_top"] == "/u/train.py:33"


def test_a_wait_between_steps_without_stack_samples_says_so():
    v = evaluate(job(Rank(gap=0.03, cpu=0.07, cpu_span="body", gap_cpu=0.0)).view())
    assert (v.bottleneck, v.headline, v.suggestions) == \
        ("host_wait", "Host wait: 30% of each step waits between steps, in the loop's own work; no stack samples "
                      "say where", WAIT_FIXES)


def test_busy_work_before_the_steps_lines_is_the_next_batch_built_on_the_training_thread():
    v = _between(12, "busy", 18)
    assert (v.bottleneck, v.headline) == \
        ("data_preprocessing", "Data preprocessing: 30% of each step prepares the next batch on the training thread "
                               "between steps, most in train at train.py:12 in train (30%)")
    assert v.suggestions == [
        "start with train at train.py:12 in train: 30% ± 2% of each step",
        "move the preparation into a Dataset and a DataLoader(num_workers=N), so batches are built while the step "
        "runs", "preprocess offline (cache tokenized or decoded data)",
        "batch the work: one vectorised call per batch instead of a Python loop per sample"]
    assert v.evidence["where_top"] == "/u/train.py:12"


def test_busy_work_after_the_steps_lines_is_the_loops_own_work():
    v = _between(60, "busy", 0)
    assert (v.bottleneck, v.headline) == \
        ("loop_work", "Loop work: 30% of each step is the loop's own work between steps, most in train at "
                      "train.py:60 in train (30%)")
    assert v.suggestions == ["start with train at train.py:60 in train: 30% ± 2% of each step", *WORK_FIXES]
    assert v.evidence["where_top"] == "/u/train.py:60"
    unsampled = evaluate(job(Rank(gap=0.03, cpu=0.07, cpu_span="body", gap_cpu=0.03)).view())
    assert unsampled.bottleneck == "loop_work" and unsampled.headline.startswith(
        "Loop work: 30% of each step is the loop's own work between steps; cannot tell")
    assert unsampled.suggestions == [*WORK_FIXES, "stack samples between steps (wire 1.5) say which line: a newer "
                                                  "probe sends them"]


def _held(samples: int) -> Verdict:
    """The wait at train.py:33, with another thread seen on CPU holding the GIL in ``samples`` of its 20."""
    rec = between(T0, T0 + 3.0, [(33, "waiting", 20, 0)])
    rec["holders"] = [{"thread": "metrics-encoder", "file": "/u/enc.py", "line": 21, "function": "encode_forever",
                       "span": "between", "n": samples}]
    return evaluate(job(Rank(gap=0.03, extra_records=[rec])).view())


def test_a_thread_holding_the_gil_through_the_wait_is_named_with_its_fix_first():
    v = _held(19)
    assert v.headline == ("Host wait: 30% of each step waits between steps, most in train at train.py:33 in train "
                          "(30%); thread `metrics-encoder` holds the GIL 29% of the step in `encode_forever` at "
                          "enc.py:21")
    assert v.suggestions[1] == (
        "thread `metrics-encoder` runs Python in encode_forever at enc.py:21 while the training thread waits for the "
        "GIL: move that work out of the process (multiprocessing, a separate service) or into code that releases the "
        "GIL (torch/numpy ops on whole arrays, a C extension); on a free-threaded Python (3.13t and later) the "
        "threads run Python in parallel")
    assert v.suggestions[2:] == WAIT_FIXES
    assert v.evidence["gil_holder"] == {"thread": "metrics-encoder", "file": "/u/enc.py", "line": 21,
                                        "function": "encode_forever", "call": None, "span": "between",
                                        "samples": 19, "share": 0.285, "of_waiting": 0.95}
    rare = _held(2)                                  # in 10% of the waiting samples: not the cause
    assert "GIL" not in rare.headline and "gil_holder" not in rare.evidence
