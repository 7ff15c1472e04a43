"""StepFinder: the step rules of zero-code mode, driven with synthetic hook events and times."""

from __future__ import annotations

import pytest

from probe.stepfinder import StepFinder


class Loop:
    """A fake training loop clock: each call advances time by the given seconds."""

    def __init__(self, optimizers: int = 1) -> None:
        self.t = 0.0
        self.steps: list[tuple[float, float, dict, int | None]] = []
        self.f = StepFinder(lambda s, e, ph, n, cpu: self.steps.append((s, e, ph, n)))
        self.f.optimizers = optimizers

    def fetch(self, secs: float = 0.01, samples: int = 8, source: int = 1) -> None:
        t0 = self.t
        self.t += secs
        self.f.fetch(t0, self.t, samples, source=source)

    def forward(self, secs: float = 0.02) -> None:
        self.f.forward_begin(self.t)
        self.t += secs
        self.f.forward_end(self.t)

    def backward(self, secs: float = 0.03) -> None:
        self.f.backward_begin(self.t)
        self.t += secs
        self.f.backward_end(self.t)

    def opt(self, which: int = 1, secs: float = 0.005) -> None:
        self.f.optimizer_begin(self.t)
        self.t += secs
        self.f.optimizer_end(self.t, which)

    def idle(self, secs: float) -> None:
        self.t += secs


def test_plain_loop_one_step_per_optimizer_step_with_phases():
    loop = Loop()
    for _ in range(3):
        loop.fetch()
        loop.forward()
        loop.backward()
        loop.opt()
    loop.f.flush()
    assert len(loop.steps) == 3
    start, end, phases, samples = loop.steps[1]
    assert (start, end) == pytest.approx((0.065, 0.130))
    assert phases == pytest.approx({"data": 0.01, "forward": 0.02, "backward": 0.03, "optimizer": 0.005})
    assert samples == 8


def test_first_step_is_settled_by_the_next_fetch_then_steps_end_at_once():
    loop = Loop()
    loop.fetch(); loop.forward(); loop.backward(); loop.opt()
    assert loop.steps == []                      # is another optimizer about to step? not known yet
    loop.fetch()
    assert len(loop.steps) == 1 and loop.steps[0][1] == pytest.approx(0.065)
    loop.forward(); loop.backward(); loop.opt()
    assert len(loop.steps) == 2                  # now known to end steps: emitted immediately


def test_time_between_steps_stays_outside_them():
    loop = Loop()
    for i in range(4):
        loop.fetch()
        loop.forward()
        loop.backward()
        loop.opt()
        if i == 1:
            loop.idle(0.5)                       # checkpoint save
    loop.f.flush()
    starts = [s for s, _, _, _ in loop.steps]
    ends = [e for _, e, _, _ in loop.steps]
    assert starts[2] - ends[1] == pytest.approx(0.5)
    assert all(e - s == pytest.approx(0.065) for s, e, _, _ in loop.steps)


def test_gradient_accumulation_is_one_step():
    loop = Loop()
    for _ in range(2):
        for _ in range(4):
            loop.fetch()
            loop.forward()
            loop.backward()
        loop.opt()
    loop.f.flush()
    assert len(loop.steps) == 2
    _, _, phases, samples = loop.steps[1]
    assert phases["backward"] == pytest.approx(0.12) and phases["data"] == pytest.approx(0.04)
    assert samples == 32


def test_optimizers_stepped_back_to_back_are_one_step():
    loop = Loop(optimizers=2)
    for _ in range(3):
        loop.fetch(); loop.forward(); loop.backward()
        loop.opt(which=1)
        loop.opt(which=2)
    loop.f.flush()
    assert len(loop.steps) == 3
    assert loop.steps[2][2]["optimizer"] == pytest.approx(0.01)
    assert loop.f.closers == {2}


def test_each_optimizer_step_after_its_own_backward_is_a_step():
    loop = Loop(optimizers=2)                    # GAN: discriminator then generator
    for _ in range(2):
        loop.fetch()
        loop.forward(); loop.backward(); loop.opt(which=1)
        loop.forward(); loop.backward(); loop.opt(which=2)
    loop.f.flush()
    assert len(loop.steps) == 4


def test_without_an_optimizer_a_backward_ends_the_step():
    loop = Loop(optimizers=0)
    for _ in range(3):
        loop.forward()
        loop.backward()
        loop.idle(0.004)                         # the manual update, between steps
    assert len(loop.steps) == 3
    s, e, phases, samples = loop.steps[2]
    assert e - s == pytest.approx(0.05) and samples is None
    assert loop.f.trained


def test_raw_tensor_step_without_forward_or_fetch_starts_at_the_previous_end():
    loop = Loop(optimizers=0)
    loop.idle(0.02)
    loop.backward()
    loop.idle(0.02)                              # forward math on raw tensors: no hook sees it
    loop.backward()
    assert loop.steps[1][0] == pytest.approx(loop.steps[0][1])


def test_an_evaluation_loaders_fetches_between_steps_are_not_the_next_steps_data():
    loop = Loop()
    loop.fetch(); loop.forward(); loop.backward(); loop.opt()
    loop.fetch(samples=4, source=2)              # evaluation batches (their forwards run under no_grad)
    loop.fetch(samples=4, source=2)
    train_fetch = loop.t
    loop.fetch()
    loop.forward(); loop.backward(); loop.opt()
    loop.f.flush()
    assert loop.steps[1][0] == pytest.approx(train_fetch) and loop.steps[1][3] == 8
    assert loop.steps[1][2]["data"] == pytest.approx(0.01)


def test_an_accumulation_window_fetched_before_its_first_forward_is_all_the_steps_data():
    """A trainer (Hugging Face) fetches every micro-batch of the window, then runs them."""
    loop = Loop()
    for _ in range(3):
        loop.idle(0.05)                          # logging between steps: not data wait
        loop.fetch(0.01); loop.fetch(0.02)
        for _ in range(2):
            loop.forward(); loop.backward()
        loop.opt()
    loop.f.flush()
    assert len(loop.steps) == 3
    start, end, phases, samples = loop.steps[2]
    assert phases["data"] == pytest.approx(0.03) and samples == 16
    assert start - loop.steps[1][1] == pytest.approx(0.05)     # the step starts at its first fetch


def test_flush_settles_a_pending_last_step():
    loop = Loop()
    loop.fetch(); loop.forward(); loop.backward(); loop.opt()
    loop.f.flush()
    assert len(loop.steps) == 1
    loop.f.flush()
    assert len(loop.steps) == 1


def test_loader_cpu_of_the_training_thread_is_summed_per_step():
    cpus = []
    f = StepFinder(lambda s, e, ph, n, cpu: cpus.append(cpu))
    f.optimizers = 1
    f.fetch(0.0, 0.01, 8, cpu=0.004)
    f.forward_begin(0.01)
    f.forward_end(0.02)
    f.fetch(0.02, 0.03, 8, cpu=0.005)
    f.backward_begin(0.03)
    f.backward_end(0.04)
    f.optimizer_begin(0.04)
    f.optimizer_end(0.05, 1)
    f.fetch(0.05, 0.06, 8)                       # multi-worker loader: no CPU figure
    f.forward_begin(0.06)
    f.optimizer_begin(0.07)
    f.optimizer_end(0.08, 1)
    assert cpus == [pytest.approx(0.009), None]


def test_an_optimizer_step_no_hook_saw_ends_the_step_where_it_is_noticed():
    """A compiled train step: only the eager backward is seen; the parameter change, noticed at the
    next backward, ends the step there."""
    loop = Loop()
    for _ in range(3):
        loop.idle(0.02)                 # compiled forward: no hook
        loop.f.optimizer_unseen(loop.t)  # the previous step's update, noticed now (nothing open at first)
        loop.backward(0.03)
        loop.idle(0.01)                 # compiled optimizer step: no hook
    loop.f.optimizer_unseen(loop.t)     # at exit
    assert len(loop.steps) == 3
    # each step runs from one notice to the next (its backward, its update, the next forward);
    # the last ends when its update is noticed at exit
    assert [round(e - s, 6) for s, e, _, _ in loop.steps] == [0.06, 0.06, 0.04]
    assert all(set(ph) == {"backward"} for _, _, ph, _ in loop.steps)


def test_an_unseen_optimizer_step_with_nothing_open_emits_nothing():
    loop = Loop()
    loop.f.optimizer_unseen(1.0)
    assert loop.steps == []
