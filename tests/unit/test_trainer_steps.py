"""The callbacks' shared step logic (probe.integrations.steps) against a recording probe: steps
end when the trainer's global step moves, micro-batch waits are data, pauses are not."""

from __future__ import annotations

import time

import pytest

from probe.integrations.steps import TrainerSteps, batch_size


class Recorder:
    """Stands in for the probe: keeps what ``begin_step``/``add_step`` were given."""

    def __init__(self) -> None:
        self.begun = 0
        self.cpu0: list = []
        self.steps: list[dict] = []

    def begin_step(self, cpu0=None) -> None:
        self.begun += 1
        self.cpu0.append(cpu0)

    def add_step(self, start, end, phases=None, samples=None, data_cpu=None, tokens=None) -> None:
        self.steps.append({"start": start, "end": end, "phases": phases, "samples": samples, "data_cpu": data_cpu,
                           "tokens": tokens})


def _steps(global_step: int = 0) -> tuple[TrainerSteps, Recorder]:
    steps, rec = TrainerSteps(), Recorder()
    steps.probe, steps.counted_step = rec, global_step
    return steps, rec


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_a_step_is_an_optimizer_step_and_the_waits_between_its_micro_batches_are_data():
    steps, rec = _steps()
    steps.batch_start()
    steps.batch_end(global_step=0, samples=8)          # accumulation: no optimizer step yet
    _busy(0.02)                                          # collating the second micro-batch
    steps.batch_start()
    steps.batch_end(global_step=1, samples=8, tokens_seen=128)
    assert rec.begun == 1 and len(rec.steps) == 1
    assert rec.steps[0]["samples"] == 16 and rec.steps[0]["tokens"] is None    # no earlier count to diff
    assert rec.steps[0]["phases"]["data"] == pytest.approx(0.02, abs=0.01)


def test_the_wait_before_a_step_is_data_with_its_cpu_and_a_pause_is_not():
    steps, rec = _steps()
    steps.batch_start()
    steps.batch_end(global_step=1, samples=4, tokens_seen=100)
    steps_cpu_at_first_end = steps.prev_cpu
    _busy(0.03)                                          # the loader, on this thread
    steps.batch_start()
    steps.batch_end(global_step=2, samples=4, tokens_seen=164)
    second = rec.steps[1]
    assert second["phases"]["data"] == pytest.approx(0.03, abs=0.01)
    assert second["data_cpu"] == pytest.approx(second["phases"]["data"], rel=0.5)
    assert second["tokens"] == 64
    time.sleep(0.05)                                     # evaluation ...
    steps.pause(0.05)
    steps.batch_start()
    steps.batch_end(global_step=3, samples=4)
    third = rec.steps[2]
    assert third["phases"]["data"] < 0.02               # ... is a pause between steps, not a data wait
    assert third["start"] - rec.steps[1]["end"] == pytest.approx(0.05, abs=0.005)
    assert third["data_cpu"] is None                     # a pause shared the interval: CPU not attributed
    # a step's CPU time counts from its start: the previous end when no pause came between
    assert rec.cpu0[0] is None and rec.cpu0[1] == steps_cpu_at_first_end and rec.cpu0[2] is None


def test_under_zero_code_mode_the_callback_marks_nothing():
    steps, rec = _steps()
    steps.marking = False
    steps.batch_start()
    steps.batch_end(global_step=1, samples=4)
    assert rec.begun == 0 and rec.steps == []


def test_batch_size_reads_the_first_tensor_of_any_batch_shape():
    import torch
    assert batch_size(torch.zeros(5, 3)) == 5
    assert batch_size((torch.zeros(7, 2), torch.zeros(7))) == 7
    assert batch_size({"input_ids": torch.zeros(3, 16)}) == 3
    assert batch_size("text") is None
