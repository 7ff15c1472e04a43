"""Property test of the probe API: random sequences of start/watch/loader/step/phase/
event/close, nested or out of order, in the main process, in a forked child and disabled, never
raise and never leave a thread or a socket behind."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import probe
from probe import lifecycle

OPS = st.lists(st.one_of(
    st.just(("start",)), st.just(("watch",)), st.just(("close",)), st.just(("exit",)),
    st.tuples(st.just("loader"), st.integers(0, 4), st.booleans()),
    st.tuples(st.just("step"), st.sampled_from([(), (64,), (8, 16, 1e9)])),
    st.tuples(st.just("phase"), st.sampled_from(["forward", "backward", "optimizer", "x"])),
    st.tuples(st.just("event"), st.sampled_from(["checkpoint", "custom", "warning"])),
), max_size=25)


def run_ops(ops: list[tuple]) -> None:
    """Interpret ``ops``; contexts are entered and left in the order the ops say, not nested properly."""
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = None
    open_ctx: list = []
    loaders: list = []
    for op in ops:
        kind = op[0]
        if kind == "start" or mon is None:
            mon = probe.start(job="prop", sample_hz=10)
        if kind == "watch":
            mon.watch(model=model, optimizer=opt)
        elif kind == "close":
            mon.close()
        elif kind == "exit" and open_ctx:
            open_ctx.pop(len(open_ctx) // 2).__exit__(None, None, None)   # out of order
        elif kind == "loader":
            it = mon.loader(range(op[1]))
            loaders.append(it)
            for _ in range(op[1] // 2 if op[2] else op[1]):
                next(it, None)
        elif kind == "step":
            ctx = mon.step(*op[1])
            ctx.__enter__()
            open_ctx.append(ctx)
            model(torch.ones(1, 2)).sum().backward()
            opt.step()
        elif kind == "phase":
            ctx = mon.phase(op[1])
            ctx.__enter__()
            open_ctx.append(ctx)
        elif kind == "event":
            mon.event(op[1], seconds=0.1)
    while open_ctx:
        open_ctx.pop().__exit__(None, None, None)
    for it in loaders:
        it.close()
    if mon is not None:
        mon.close()
    cur = lifecycle.current()
    if cur is not None:
        cur.close()


def _leftovers(threads_before: set, sock_dir: str) -> tuple[list[str], list[str]]:
    """This process's threads started since ``threads_before`` and its sockets in ``sock_dir``. Only
    its own sockets: a forked child shares the directory with its parent's live probe."""
    deadline = time.monotonic() + 3.0
    mine = f".p{os.getpid()}."
    while True:     # closed probes' threads end within close()'s bound; poll for it, bounded
        extra = [t.name for t in threading.enumerate() if t not in threads_before and t.is_alive()]
        socks = [p for p in os.listdir(sock_dir) if p.endswith(".sock") and mine in p]
        if (not extra and not socks) or time.monotonic() > deadline:
            return extra, socks
        time.sleep(0.01)


SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@SETTINGS
@given(ops=OPS)
def test_main_process(perfmon_dir, ops):
    before = set(threading.enumerate())
    run_ops(ops)
    assert _leftovers(before, str(perfmon_dir)) == ([], [])


@SETTINGS
@given(ops=OPS)
def test_disabled(perfmon_dir, monkeypatch, ops):
    monkeypatch.setenv("PERFMON_DISABLE", "1")
    before = set(threading.enumerate())
    run_ops(ops)
    assert _leftovers(before, str(perfmon_dir)) == ([], [])


@pytest.mark.slow
@pytest.mark.usefixtures("no_coverage_tracer")
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS, parent_started=st.booleans())
def test_forked_child(perfmon_dir, ops, parent_started):
    parent = probe.start(job="prop-parent", sample_hz=10) if parent_started else None
    try:
        pid = os.fork()
        if pid == 0:      # the child: run the sequence, then check it left nothing of its own
            code = 1
            try:
                before = set(threading.enumerate())
                run_ops(ops)
                extra, socks = _leftovers(before, str(perfmon_dir))
                code = 0 if not extra and not socks else 2
            finally:
                os._exit(code)
        deadline = time.monotonic() + 60
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            assert time.monotonic() < deadline, "forked child hung"
            time.sleep(0.01)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        if parent is not None:
            parent.close()
