"""A watched model can be deep-copied (EMA, AveragedModel) and pickled whole (``torch.save(model)``):
the copy and the file hold none of perfmon's hooks, and the saved model loads with the user's own
``weights_only`` allow-list where perfmon cannot be imported."""

from __future__ import annotations

import copy
import pickle
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

import probe
from probe.hooks import Hook


def _train_step(mon, model, opt) -> None:
    with mon.step(samples=2):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()


def _hooks(model: nn.Module) -> list:
    return [h for m in model.modules() for d in (m._forward_pre_hooks, m._forward_hooks) for h in d.values()]


def test_a_hook_on_its_own_copies_and_pickles_as_a_callable_that_does_nothing():
    """The fallback for a module class whose ``__getstate__`` does not go through nn.Module's."""
    calls = []
    hook = Hook(lambda *a: calls.append(a))
    hook(1, 2)
    assert calls == [(1, 2)]
    for copied in (copy.deepcopy(hook), pickle.loads(pickle.dumps(hook))):
        assert copied(object(), (1,), {"x": 2}, None) is None
        assert calls == [(1, 2)]


def test_a_watched_model_deep_copies_into_an_uninstrumented_model(tmp_path):
    mon = probe.start(job="copy", serve=False)
    try:
        model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        mon.watch(model, opt)
        _train_step(mon, model, opt)
        ema = copy.deepcopy(model)
        averaged = torch.optim.swa_utils.AveragedModel(model)
        assert _hooks(model) and not _hooks(ema) and not _hooks(averaged)
        steps = mon.steps
        ema(torch.randn(2, 4)).sum().backward()       # the copy's calls are not the job's steps
        averaged.update_parameters(model)
        _train_step(mon, model, opt)
        assert mon.steps == steps + 1
    finally:
        mon.close()


@pytest.mark.slow
def test_a_model_saved_whole_while_watched_loads_without_perfmon(tmp_path):
    mon = probe.start(job="save", serve=False)
    try:
        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        mon.watch(model, opt)
        _train_step(mon, model, opt)
        torch.save(model, tmp_path / "model.pt")
    finally:
        mon.close()
    loader = ("import sys; sys.modules['probe'] = None; import torch; "   # perfmon cannot be imported there
              "from torch.nn import Linear, Sequential\n"
              "with torch.serialization.safe_globals([Sequential, Linear]):\n"
              f"    m = torch.load({str(tmp_path / 'model.pt')!r})\n"
              "print(m(torch.ones(1, 4)).shape)")
    out = subprocess.run([sys.executable, "-c", loader], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "torch.Size([1, 1])"


def test_a_model_copied_while_a_profile_runs_gets_none_of_its_hooks():
    mon = probe.start(job="copy-profile", serve=False)
    try:
        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        mon.watch(model, opt)
        assert mon.handle_request({"k": "request", "t": 0.0, "id": 1, "op": "profile", "steps": 3, "depth": 1}) is None
        _train_step(mon, model, opt)           # the profile's hooks go on at this step's end
        assert len(_hooks(model)) > 2
        twin = copy.deepcopy(model)
        assert not _hooks(twin)
    finally:
        mon.close()
    assert len(_hooks(model)) == 0             # close() removed the watcher's and the profile's hooks
