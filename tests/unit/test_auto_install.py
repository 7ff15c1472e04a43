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
