"""Sync counting and the user's warnings filters, against the SIMULATED CUDA backend
(tests/sim: its ``synchronizing_op`` raises the sync ``TORCH_WARN`` as a Python UserWarning from
the caller's line when the debug mode is "warn", as torch's warning handler does)."""

from __future__ import annotations

import warnings

import pytest
import torch

import probe


@pytest.fixture
def on_sim_gpu(simulated_cuda, monkeypatch):
    """A probe watching a model placed on (simulated) cuda:0, found by the probe's own detection."""
    saved = list(warnings.filters)
    cuda = simulated_cuda()
    mons = []

    def make(**watch_options):
        model = torch.nn.Linear(2, 2)
        cuda.place(model)
        mon = probe.start(job="syncs", serve=False)
        mon.watch(model=model, **watch_options)
        mons.append(mon)
        return mon

    yield cuda, make
    for mon in mons:
        mon.close()
    warnings.filters[:] = saved
    warnings._filters_mutated()


def _steps(mon, cuda, n):
    for _ in range(n):
        with mon.step():
            cuda.synchronizing_op()


def test_counting_is_opt_in_and_off_leaves_the_debug_mode_alone(on_sim_gpu):
    cuda, make = on_sim_gpu
    mon = make()
    assert mon.attached.watcher.syncs is None and cuda.sync_mode == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _steps(mon, cuda, 3)             # nothing warns, nothing raises


def test_error_filter_set_before_start_neither_raises_nor_hides_a_sync(on_sim_gpu):
    """``python -W error`` / ``PYTHONWARNINGS=error``: the filter exists before the counter."""
    cuda, make = on_sim_gpu
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mon = make(syncs=True)
        assert cuda.sync_mode == 1
        counted = []
        mon.add_step_hooks(end=lambda extras, phases: counted.append(extras.get("syncs")))
        for _ in range(4):
            with mon.step():
                cuda.synchronizing_op()
                cuda.synchronizing_op()
        assert counted == [2, 2, 2, 2]
        with pytest.raises(UserWarning):          # other warnings still meet the user's filter
            warnings.warn("the user's own warning", stacklevel=1)


@pytest.mark.parametrize("action", ["error", "ignore", "always"])
def test_filters_added_around_the_loop_after_start_do_not_change_the_count(on_sim_gpu, action):
    cuda, make = on_sim_gpu
    mon = make(syncs=True)
    counted = []

    def take(extras, phases):
        counted.append(extras.get("syncs"))
    mon.add_step_hooks(end=take)
    with warnings.catch_warnings():               # nested, entered between steps
        warnings.simplefilter(action)
        with warnings.catch_warnings():
            warnings.filterwarnings(action, category=UserWarning)
            for _ in range(3):
                with mon.step():
                    cuda.synchronizing_op()
                    cuda.synchronizing_op()
    assert counted == [2, 2, 2]


def test_close_turns_the_debug_mode_off_and_removes_the_counter(on_sim_gpu):
    cuda, make = on_sim_gpu
    mon = make(syncs=True)
    counter = mon.attached.watcher.syncs
    assert any(f[1] is counter for f in warnings.filters)
    mon.close()
    assert cuda.sync_mode == 0 and not any(f[1] is counter for f in warnings.filters)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cuda.synchronizing_op()                   # mode 0: no warning to raise
