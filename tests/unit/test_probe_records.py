"""The step a hot path queues is read by name: every field ``records.StepItem`` names holds what
``step()`` and zero-code ``add_step`` put there, so a field added or moved in one of the two
places without the other fails here rather than as a wrong number on the wire."""

from __future__ import annotations

import time

from probe import records
from probe.core import Probe


def _queued(probe: Probe) -> records.StepItem:
    item = probe._q.pop()
    return records.StepItem._make(item)


def test_the_api_step_fills_each_named_field():
    probe = Probe._scratch()
    probe._cpu_next = True
    with probe.step(samples=8, tokens=64, flops=1e9):
        with probe.phase("forward"):
            time.sleep(0.002)
    item = _queued(probe)
    assert (item.kind, item.step, item.samples, item.tokens, item.flops) == (0, 0, 8, 64, 1e9)
    assert item.end > item.start and item.phases["forward"] >= 0.002 and item.data == 0.0
    assert item.cpu is not None and item.cpu_span == records.CPU_SPAN_BODY and item.gap >= 0.0
    rec = records.step_record(item, epoch=1000.0)
    assert rec["step"] == 0 and rec["samples"] == 8 and rec["tokens"] == 64 and rec["flops"] == 1e9
    assert rec["t"] == item.end + 1000.0 and rec["cpu_span"] == "body"


def test_a_zero_code_step_fills_each_named_field():
    probe = Probe._scratch()
    start = time.perf_counter()
    probe.begin_step()
    end = time.perf_counter()
    probe.add_step(start, end, phases={"data": 0.001, "backward": 0.002}, samples=4, data_cpu=0.0005, tokens=32)
    item = _queued(probe)
    assert (item.kind, item.step, item.samples, item.tokens, item.flops) == (0, 0, 4, 32, None)
    assert item.end == end and item.data == 0.001 and item.phases == {"backward": 0.002}
    assert item.data_cpu == 0.0005 and item.cpu_span == records.CPU_SPAN_ACTIVE
    assert records.step_record(item, epoch=0.0)["phases"]["data"] == 0.001
