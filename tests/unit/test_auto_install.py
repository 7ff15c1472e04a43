"""Zero-code mode's install and uninstall in this process (``probe.auto``): what ``perfmon
detach`` relies on to leave nothing behind."""

from __future__ import annotations

import pytest

from probe import auto

torch = pytest.importorskip("torch")


def _global_forward_hooks() -> tuple[int, int]:
    mod = torch.nn.modules.module
    return len(mod._global_forward_pre_hooks), len(mod._global_forward_hooks)


def test_the_global_hooks_are_armed_once_and_uninstall_takes_them_out():
    """An injected install runs on the injector's thread while the training thread's backward may
    arm the global hooks too: a second arming must not leave a pair that uninstall cannot see."""
    assert auto._auto is None
    before = _global_forward_hooks()
    auto.install()
    try:
        assert auto._auto is not None
        armed = _global_forward_hooks()
        assert armed == (before[0] + 1, before[1] + 1)
        auto._auto.arm_global_hooks()
        assert _global_forward_hooks() == armed
    finally:
        left = auto.uninstall()
    assert left == []
    assert _global_forward_hooks() == before


def test_an_install_inside_a_running_forward_takes_the_outer_module_as_the_root(monkeypatch):
    """``perfmon inject`` can arm the hooks while a wrapper's forward (DDP's) is under way: the first
    forward the hooks then see is the wrapped inner module's, which is not the root. The roots come
    from the forwards that begin after the probe starts, so the wrapper is the one watched."""
    monkeypatch.setenv("PERFMON_JOB", "roots")
    inner = torch.nn.Linear(4, 1)

    class Wrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.module = inner
            self.armed = False

        def forward(self, x):
            if not self.armed:      # the injector's install lands here, the wrapper's forward already begun
                self.armed = True
                auto.install([opt], running=True)
            return self.module(x)

    model = Wrapper()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    try:
        for _ in range(4):
            model(torch.ones(2, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
        a = auto._auto
        assert a is not None and a.probe is not None and a.probe.steps >= 2
        assert [r() for r in a.trained_roots] == [model]
    finally:
        assert auto.uninstall() == []
