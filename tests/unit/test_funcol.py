"""Functional collectives (DTensor's path) are timed from launch to the ``wait_tensor`` that completes
them: real torch, a one-rank gloo group in this process."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from probe import comm  # noqa: E402
from probe.comm import functional  # noqa: E402


class _Probe:
    closed = False

    def event(self, *a, **k) -> None:
        pass


@pytest.fixture
def patched():
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    state = comm.install(_Probe())
    try:
        yield state
    finally:
        comm.uninstall()
        dist.destroy_process_group()


def _items(state: comm.CommState) -> list[comm.CollectiveCall]:
    return list(state.tracker.done)


def test_a_functional_all_reduce_is_timed_when_its_result_is_used(patched):
    from torch.distributed import _functional_collectives as funcol

    x = torch.ones(256)
    out = funcol.all_reduce(x, "sum", dist.group.WORLD)
    assert _items(patched) == []                 # launched, not yet waited for
    (out + 1).sum()                              # first use waits
    [item] = _items(patched)
    assert (item.op, item.count, item.nbytes, item.n) == ("all_reduce", 1, 256 * 4, 1)
    assert item.seconds is not None and 0 <= item.exposed <= item.seconds


def test_nested_functional_collectives_are_counted_once(patched):
    from torch.distributed import _functional_collectives as funcol

    if not hasattr(funcol, "all_gather_single_autograd"):     # torch 2.11 has none; 2.13 does
        pytest.skip(f"torch {torch.__version__} has no nested functional collective (all_gather_single_autograd)")
    out = funcol.all_gather_single_autograd(torch.ones(8, 4), 0, dist.group.WORLD)   # calls all_gather_single
    out.sum()
    [item] = _items(patched)
    assert (item.op, item.nbytes) == ("all_gather", 8 * 4 * 4)


def test_a_wait_for_a_collective_launched_elsewhere_counts_as_other(patched):
    from torch.distributed import _functional_collectives as funcol

    t = torch.ops._c10d_functional.all_reduce(torch.ones(16), "sum", "0")   # the op itself, as autograd does
    funcol.wait_tensor(t)
    [item] = _items(patched)
    assert (item.op, item.nbytes) == ("other", 16 * 4) and item.exposed == item.seconds


def test_launched_but_never_waited_collectives_are_bounded(patched, monkeypatch):
    from torch.distributed import _functional_collectives as funcol

    monkeypatch.setattr(functional, "MAX_FUNCOL_PENDING", 4)
    kept = [funcol.all_reduce(torch.ones(2), "sum", dist.group.WORLD) for _ in range(10)]
    assert len(patched.funcol.pending) == 4
    for t in kept:
        t.wait()


def test_uninstall_restores_the_functional_collectives(patched):
    from torch.distributed import _functional_collectives as funcol

    assert getattr(funcol.all_reduce, "_perfmon", False)
    comm.uninstall()
    assert not getattr(funcol.all_reduce, "_perfmon", False)
    assert not getattr(funcol.wait_tensor, "_perfmon", False)
