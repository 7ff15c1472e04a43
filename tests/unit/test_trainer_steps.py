"""The callbacks' shared step logic (probe.integrations.steps) against a recording probe, fed by real
DataLoaders through the batch-fetch clock: steps end when the trainer's global step moves, a step's
data wait is the time its batches took to fetch, and the rest of the time between steps (logging,
evaluation) is not data wait but the gap before the step's start."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from probe.integrations.steps import TrainerSteps, batch_size

FETCH_S = 0.02      # each batch's __getitem__ sleeps this long
LOGGING_S = 0.06    # a "logging callback" between steps; counted as data wait it would triple the wait


class Recorder:
    """Stands in for the probe: keeps what ``begin_step``/``add_step``/``event`` were given."""

    def __init__(self) -> None:
        self.cpu0: list = []
        self.steps: list[dict] = []
        self.events: list[tuple[str, dict]] = []
        self.first_batch_wait = None

    def begin_step(self, cpu0=None) -> None:
        self.cpu0.append(cpu0)

    def add_step(self, start, end, phases=None, samples=None, data_cpu=None, tokens=None) -> None:
        self.steps.append({"start": start, "end": end, "phases": phases, "samples": samples, "data_cpu": data_cpu,
                           "tokens": tokens})

    def event(self, name, **fields) -> None:
        self.events.append((name, fields))

    def report_error(self, where, exc) -> None:
        raise AssertionError(f"{where}: {exc!r}")


class Slow(Dataset):
    """Batches (batch_size=None: one item each) that take ``seconds`` to load, sleeping or on the CPU."""

    def __init__(self, seconds: float = FETCH_S, busy: bool = False) -> None:
        self.seconds, self.busy = seconds, busy

    def __len__(self) -> int:
        return 1000

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.busy:
            end = time.thread_time() + self.seconds
            while time.thread_time() < end:
                pass
        else:
            time.sleep(self.seconds)
        return torch.zeros(4, 2)


@pytest.fixture
def steps():
    steps, rec = TrainerSteps(), Recorder()
    steps.probe, steps.counted_step = rec, 0
    steps.listen()
    yield steps, rec
    steps.detach()


def _fetch(it) -> float:
    """``next(it)``, and how long it took as the caller saw it: the most a fetch clock inside it can read."""
    t0 = time.perf_counter()
    next(it)
    return time.perf_counter() - t0


def _train_step(steps: TrainerSteps, it, global_step: int) -> float:
    """One training step's fetch and callbacks; the fetch's time, as the caller saw it."""
    fetched = _fetch(it)
    steps.batch_start()
    steps.batch_end(global_step=global_step, samples=4)
    return fetched


def test_a_steps_data_wait_is_its_batch_fetch_and_the_logging_after_the_previous_step_is_not(steps):
    steps, rec = steps
    it = iter(DataLoader(Slow(), batch_size=None))
    fetched = []
    for n in range(1, 4):
        fetched.append(_train_step(steps, it, n))
        time.sleep(LOGGING_S)                 # the trainer's logging callbacks
    assert len(rec.steps) == 3
    first, *later = rec.steps
    assert rec.events[0][0] == "first_batch" and rec.events[0][1]["seconds"] >= FETCH_S
    assert first["phases"] == {"data": 0.0}   # the first batch is the loader's start-up, reported apart
    for prev, step, fetch in zip(rec.steps, later, fetched[1:]):
        assert FETCH_S <= step["phases"]["data"] <= fetch      # its fetch, none of the logging before it
        assert step["data_cpu"] < FETCH_S / 2                 # a sleeping loader: waiting, not preprocessing
        assert step["start"] - prev["end"] >= LOGGING_S       # the gap before the step: not in its wait
    assert all(c is not None for c in rec.cpu0)               # CPU time counts from each step's first fetch


def test_a_cpu_bound_single_process_loader_is_the_training_threads_cpu_in_the_wait(steps):
    steps, rec = steps
    it = iter(DataLoader(Slow(busy=True), batch_size=None))
    for n in range(1, 4):
        _train_step(steps, it, n)
    assert len(rec.steps) == 3
    for step in rec.steps[1:]:
        assert FETCH_S <= step["data_cpu"] <= step["phases"]["data"]


def test_micro_batch_fetches_are_the_steps_data_and_the_time_between_them_is_not(steps):
    steps, rec = steps
    it = iter(DataLoader(Slow(), batch_size=None))
    _train_step(steps, it, 1)
    fetched = 0.0
    for global_step in (1, 2):               # gradient accumulation 2: one step, two fetches
        fetched += _fetch(it)
        steps.batch_start()
        time.sleep(LOGGING_S)                 # inside the step, not a fetch
        steps.batch_end(global_step=global_step, samples=8)
    assert len(rec.steps) == 2 and rec.steps[1]["samples"] == 16
    assert 2 * FETCH_S <= rec.steps[1]["phases"]["data"] <= fetched      # both fetches, no time between them


def test_an_evaluation_loaders_fetches_between_steps_are_not_data_wait(steps):
    steps, rec = steps
    it = iter(DataLoader(Slow(), batch_size=None))
    _train_step(steps, it, 1)
    _train_step(steps, it, 2)
    evaluation = iter(DataLoader(Slow(), batch_size=None))
    for _ in range(3):                        # 3 fetches from another loader, 3 x FETCH_S
        next(evaluation)
    fetched = _train_step(steps, it, 3)
    assert len(rec.steps) == 3
    assert FETCH_S <= rec.steps[2]["phases"]["data"] <= fetched     # the training loader's fetch only
    assert rec.steps[2]["start"] - rec.steps[1]["end"] >= 3 * FETCH_S      # the evaluation is the gap


def test_a_fetch_on_another_thread_is_no_wait_of_the_training_thread(steps):
    steps, rec = steps
    it = iter(DataLoader(Slow(), batch_size=None))
    _train_step(steps, it, 1)
    prefetcher = threading.Thread(target=lambda: next(it))
    prefetcher.start()
    prefetcher.join()
    steps.batch_start()
    steps.batch_end(global_step=2, samples=4)
    assert rec.steps[1]["phases"] == {"data": 0.0}


def test_without_a_dataloader_the_data_wait_is_unknown_not_zero(steps):
    steps, rec = steps
    for n in (1, 2):
        steps.batch_start()
        steps.batch_end(global_step=n, samples=4)
    assert [s["phases"] for s in rec.steps] == [None, None]


def test_under_zero_code_mode_the_callback_marks_nothing():
    steps, rec = TrainerSteps(), Recorder()
    steps.probe, steps.counted_step, steps.marking = rec, 0, False
    steps.batch_start()
    steps.batch_end(global_step=1, samples=4)
    assert rec.cpu0 == [] and rec.steps == []


def test_batch_size_reads_the_first_tensor_of_any_batch_shape():
    assert batch_size(torch.zeros(5, 3)) == 5
    assert batch_size((torch.zeros(7, 2), torch.zeros(7))) == 7
    assert batch_size({"input_ids": torch.zeros(3, 16)}) == 3
    assert batch_size("text") is None
