"""StepFinder: the step rules of zero-code mode, driven with synthetic hook events and times."""

from __future__ import annotations

import pytest

from probe.stepfinder import WAIT_SEGMENTS, StepFinder


class Loop:
    """A fake training loop clock: each call advances time by the given seconds."""

    def __init__(self, optimizers: int = 1) -> None:
        self.t = 0.0
        self.steps: list[tuple[float, float, dict, int | None]] = []
        self.evals: list[tuple[float, float, int, float | None]] = []
        self.f = StepFinder(lambda s, e, ph, n, cpu: self.steps.append((s, e, ph, n)),
                            on_eval=lambda *a: self.evals.append(a))
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
    loop.fetch()
    loop.forward()
    loop.backward()
    loop.opt()
    assert loop.steps == []                      # is another optimizer about to step? not known yet
    loop.fetch()
    assert len(loop.steps) == 1 and loop.steps[0][1] == pytest.approx(0.065)
    loop.forward()
    loop.backward()
    loop.opt()
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
        loop.fetch()
        loop.forward()
        loop.backward()
        loop.opt(which=1)
        loop.opt(which=2)
    loop.f.flush()
    assert len(loop.steps) == 3
    assert loop.steps[2][2]["optimizer"] == pytest.approx(0.01)
    assert loop.f.closers == {2}


def gan_iteration(loop: Loop, critic: int = 1, d: int = 1, g: int = 2) -> None:
    """A (W)GAN iteration: ``critic`` discriminator steps, each on its own batch, then a generator step."""
    for _ in range(critic):
        loop.fetch()
        loop.forward()
        loop.backward()
        loop.forward()
        loop.forward()
        loop.backward()
        loop.opt(which=d)
    loop.forward()
    loop.backward()
    loop.opt(which=g)


def test_a_gan_iteration_of_two_optimizer_steps_is_one_step_with_a_part_per_optimizer():
    loop = Loop(optimizers=2)
    loop.f.labels = {1: "Discriminator", 2: "Generator"}
    for _ in range(4):
        gan_iteration(loop)
    loop.f.flush()
    assert len(loop.steps) == 4
    durations = {round(e - s, 6) for s, e, _, _ in loop.steps}
    assert durations == {0.19}                                     # the whole iteration, every time
    _, _, phases, samples = loop.steps[2]
    assert phases == pytest.approx({"data": 0.01, "Discriminator": 0.125, "Generator": 0.055})
    assert samples == 8


def test_a_wgan_iteration_of_five_critic_steps_and_a_generator_step_is_one_step():
    loop = Loop(optimizers=2)
    for _ in range(3):
        gan_iteration(loop, critic=5)
    loop.f.flush()
    assert len(loop.steps) == 3
    assert all(e - s == pytest.approx(5 * 0.135 + 0.055) for s, e, _, _ in loop.steps)
    assert loop.steps[1][2]["optimizer 1"] == pytest.approx(5 * 0.125)
    assert loop.steps[1][3] == 40


def test_a_generator_stepped_before_its_critics_is_found_as_the_rarer_optimizer():
    """G first, then 5 critic steps: the first step ends at the first critic step (equals so far:
    the one that stepped last), after that every step is one generator and five critic steps."""
    loop = Loop(optimizers=2)
    for _ in range(4):
        loop.forward()
        loop.backward()
        loop.opt(which=2)
        for _ in range(5):
            loop.fetch()
            loop.forward()
            loop.backward()
            loop.opt(which=1)
    loop.f.flush()
    sizes = [round((e - s) / 0.065) for s, e, _, _ in loop.steps]
    assert sizes[0] == 2 and set(sizes[2:]) == {6}


def test_one_optimizer_per_task_stepped_in_turn_is_one_step():
    loop = Loop(optimizers=3)
    for _ in range(3):
        loop.fetch()
        for task in (1, 2, 3):
            loop.forward()
            loop.backward()
            loop.opt(which=task)
    loop.f.flush()
    assert len(loop.steps) == 3
    assert set(loop.steps[2][2]) == {"data", "optimizer 1", "optimizer 2", "optimizer 3"}


def test_an_optimizer_built_but_never_stepped_holds_only_the_first_step():
    loop = Loop(optimizers=2)
    for _ in range(12):
        loop.fetch()
        loop.forward()
        loop.backward()
        loop.opt(which=1)
    loop.f.flush()
    assert len(loop.steps) == 12 - WAIT_SEGMENTS + 1
    assert loop.steps[-1][1] - loop.steps[-1][0] == pytest.approx(0.065)


def test_an_inner_optimizer_stepped_inside_the_outer_one_does_not_hold_the_first_step():
    loop = Loop(optimizers=2)                   # ZeroRedundancyOptimizer builds its local optimizer
    loop.f.inner.add(99)
    for _ in range(3):
        loop.fetch()
        loop.forward()
        loop.backward()
        loop.opt(which=1)
    loop.f.flush()
    assert len(loop.steps) == 3


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
    loop.fetch()
    loop.forward()
    loop.backward()
    loop.opt()
    loop.fetch(samples=4, source=2)              # evaluation batches (their forwards run under no_grad)
    loop.fetch(samples=4, source=2)
    train_fetch = loop.t
    loop.fetch()
    loop.forward()
    loop.backward()
    loop.opt()
    loop.f.flush()
    assert loop.steps[1][0] == pytest.approx(train_fetch) and loop.steps[1][3] == 8
    assert loop.steps[1][2]["data"] == pytest.approx(0.01)


def test_an_accumulation_window_fetched_before_its_first_forward_is_all_the_steps_data():
    """A trainer (Hugging Face) fetches every micro-batch of the window, then runs them."""
    loop = Loop()
    for _ in range(3):
        loop.idle(0.05)                          # logging between steps: not data wait
        loop.fetch(0.01)
        loop.fetch(0.02)
        for _ in range(2):
            loop.forward()
            loop.backward()
        loop.opt()
    loop.f.flush()
    assert len(loop.steps) == 3
    start, end, phases, samples = loop.steps[2]
    assert phases["data"] == pytest.approx(0.03) and samples == 16
    assert start - loop.steps[1][1] == pytest.approx(0.05)     # the step starts at its first fetch


def test_flush_settles_a_pending_last_step():
    loop = Loop()
    loop.fetch()
    loop.forward()
    loop.backward()
    loop.opt()
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


def train_step(loop: Loop) -> None:
    loop.fetch()
    loop.forward()
    loop.backward()
    loop.opt()


def eval_pass(loop: Loop, batches: int, with_loader: bool = True) -> None:
    """An evaluation run in train mode with grad enabled: forwards that no backward follows."""
    for _ in range(batches):
        if with_loader:
            loop.fetch(0.002, samples=4, source=2)
        loop.forward(0.01)


def test_an_evaluation_without_no_grad_is_cut_off_the_next_step_and_reported():
    loop = Loop()
    for _epoch in range(2):
        eval_pass(loop, 8)
        for _ in range(3):
            train_step(loop)
    loop.f.flush()
    assert len(loop.steps) == 6
    assert all(e - s == pytest.approx(0.065) for s, e, _, _ in loop.steps[1:])
    start, end, phases, samples = loop.steps[3]
    assert phases == pytest.approx({"data": 0.01, "forward": 0.02, "backward": 0.03, "optimizer": 0.005})
    assert samples == 8
    assert len(loop.evals) == 1                   # the first epoch's: no training seen yet to compare with
    e0, e1, forwards, _ = loop.evals[0]
    assert (e1 - e0, forwards, e1) == (pytest.approx(8 * 0.012), 8, pytest.approx(start))


def test_an_evaluation_on_tensors_without_a_loader_is_cut_at_the_training_forward():
    loop = Loop()
    for _ in range(3):
        train_step(loop)
    eval_pass(loop, 6, with_loader=False)
    loop.forward()
    loop.backward()
    loop.opt()
    loop.f.flush()
    assert len(loop.evals) == 1 and loop.evals[0][2] == 6
    s, e, phases, _ = loop.steps[-1]
    assert e - s == pytest.approx(0.055) and phases["forward"] == pytest.approx(0.02)


def test_forwards_that_a_training_step_always_makes_are_not_evaluation():
    """A GAN's discriminator runs three forwards before the second backward; a two-loader loop
    forwards each loader's batch before one backward: their usual shape, never evaluation."""
    loop = Loop(optimizers=2)
    for _ in range(4):
        gan_iteration(loop)
    two = Loop()
    for _ in range(4):
        two.fetch(source=1)
        two.forward()
        two.fetch(source=2)
        two.forward()
        two.backward()
        two.opt()
    two.f.flush()
    assert loop.evals == [] and two.evals == []
    assert all(e - s == pytest.approx(0.095) for s, e, _, _ in two.steps)


def test_an_evaluation_at_the_end_of_training_is_reported_at_flush():
    loop = Loop()
    for _ in range(3):
        train_step(loop)
    eval_pass(loop, 5)
    loop.f.flush()
    assert len(loop.steps) == 3 and len(loop.evals) == 1
    assert loop.evals[0][1] - loop.evals[0][0] == pytest.approx(5 * 0.012)


def test_the_cut_steps_cpu_clock_starts_at_the_training_batchs_fetch():
    evals = []
    f = StepFinder(lambda *a: None, on_eval=lambda *a: evals.append(a))
    f.optimizers = 1
    t = 0.0
    for i in range(2):
        for _ in range(5 if i else 0):
            f.fetch(t, t + 0.01, 4, source=2, cpu0=100.0 + t)
            f.forward_begin(t + 0.01)
            f.forward_end(t + 0.02)
            t += 0.02
        f.fetch(t, t + 0.01, 8, source=1, cpu0=100.0 + t)
        f.forward_begin(t + 0.01)
        f.forward_end(t + 0.02)
        f.backward_begin(t + 0.02)
        f.backward_end(t + 0.03)
        f.optimizer_begin(t + 0.03)
        f.optimizer_end(t + 0.04, 1)
        t += 0.04
    assert len(evals) == 1 and evals[0][3] == pytest.approx(100.0 + 0.04 + 5 * 0.02)


def test_parts_are_named_after_the_module_each_optimizer_updates():
    import weakref

    import torch

    from probe.part_names import part_name

    class Generator(torch.nn.Linear):
        pass

    class Discriminator(torch.nn.Linear):
        pass

    g, d, stray = Generator(2, 2), Discriminator(2, 1), torch.nn.Linear(1, 1)
    roots = [weakref.ref(g), weakref.ref(d)]
    opts = [torch.optim.Adam(m.parameters()) for m in (d, g, stray)]
    names: list[str] = []
    for opt in opts:
        names.append(part_name(opt, roots, names))
    assert names == ["Discriminator", "Generator", "Adam 3"]
    assert part_name(torch.optim.SGD(d.parameters(), lr=0.1), roots, names) == "Discriminator 4"
