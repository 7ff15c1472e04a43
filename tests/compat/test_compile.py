"""perfmon stays out of ``torch.compile``'s graphs (in-process, real dynamo on CPU).

Dynamo's own counters are the witness: the same number of graphs and no graph break
with perfmon watching as without it, no recompilation when perfmon attaches to an
already compiled model, and the same loss to the last bit.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dynamo = pytest.importorskip("torch._dynamo")
from torch import nn  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402

import probe  # noqa: E402
from probe import flops  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Compiling marks the process as one that runs compiled code (``probe.tracing.dynamo_has_compiled``),
    which switches off live FLOP counting; leave no trace of it for the tests that follow."""
    yield
    dynamo.reset()
    counters.clear()


def _train(watch: bool, steps: int = 6, watch_after: int | None = None) -> tuple[float, dict[str, Any]]:
    dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    mon = probe.start(job="compile-test", serve=False) if watch or watch_after is not None else None
    if watch:
        mon.watch(model=model, optimizer=opt)
    compiled = torch.compile(model)
    x, y = torch.randn(8, 16), torch.randn(8, 1)
    loss = torch.tensor(0.0)
    for i in range(steps):
        if watch_after is not None and i == watch_after:
            mon.watch(model=model, optimizer=opt)
        loss = ((compiled(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    stats = {"graphs": counters["stats"]["unique_graphs"], "breaks": sum(counters["graph_break"].values()),
             "frames": counters["frames"]["ok"]}
    if mon is not None:
        mon.close()
    return loss.item(), stats


def test_a_watched_compiled_model_gets_the_same_graphs_and_no_graph_break() -> None:
    loss_plain, plain = _train(watch=False)
    loss_watched, watched = _train(watch=True)
    assert watched["breaks"] == 0
    assert watched["graphs"] == plain["graphs"] and watched["frames"] == plain["frames"]
    assert loss_watched == loss_plain


def test_watching_an_already_compiled_model_causes_no_recompilation() -> None:
    _, plain = _train(watch=False)
    loss_late, late = _train(watch=False, watch_after=3)
    assert late["frames"] == plain["frames"] and late["graphs"] == plain["graphs"]
    assert late["breaks"] == 0


def test_the_background_flop_count_installs_no_global_module_hooks() -> None:
    """torch's FlopCounterMode registers process-global module hooks that the training thread's
    (compiled) modules then run; perfmon's counter is a thread-local dispatch mode only."""
    inside, release = threading.Event(), threading.Event()

    class Probe(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x: Any) -> Any:
            inside.set()
            release.wait(30)
            return self.lin(x)

    replica = flops.meta_replica(Probe())
    result: list[tuple[int, int]] = []
    worker = threading.Thread(target=lambda: result.append(
        flops.count_meta(replica, (torch.empty(4, 8, device="meta"),), {}, backward=True)))
    worker.start()
    assert inside.wait(30)
    try:
        module_mod = torch.nn.modules.module
        assert not module_mod._global_forward_pre_hooks and not module_mod._global_forward_hooks
        assert not module_mod._global_backward_pre_hooks and not module_mod._global_backward_hooks
        # and this thread's ops are not counted by the other thread's mode
        torch.randn(4, 8) @ torch.randn(8, 8)
    finally:
        release.set()
        worker.join(30)
    assert result == [(2 * 4 * 8 * 8, 2 * 2 * 4 * 8 * 8)]   # forward; + the weight's gradient (data needs none)
