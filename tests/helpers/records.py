"""Wire records as the probe builds them, for tests that feed a run model, a recording or a socket.

``step`` goes through the probe's own builder (``probe.records.step_record``, from the hot path's
tuple: the phases' ``other`` is the rest of the step, as the probe computes it) and ``hello``
through ``probe.records.hello`` (every key a probe sends, then the test's values); every record
here passes the probe's wire check (``probe.wire.validate``). So a record a test builds here is one
a probe could have sent, and when the builders or the wire change these change with them. A test
about malformed, foreign-version or hand-crafted input builds that record itself: that is its point.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from probe import records, wire


def hello(rank: int = 0, *, t: float, job: str = "j", world_size: int = 1, local_rank: int | None = None,
          pid: int | None = None, restart: int = 0, host: str = "n1", device: dict[str, Any] | None = None,
          **fields: Any) -> dict[str, Any]:
    """A probe's hello for ``rank`` at ``t``; ``fields`` set any other key (``proto``, ``argv``, ...)
    or, given as None, leave it out."""
    probe = SimpleNamespace(job=job, rank=rank, local_rank=rank if local_rank is None else local_rank,
                            world_size=world_size, pid=1000 + rank if pid is None else pid, restart=restart,
                            device=device if device is not None else {"type": "cpu", "name": "CPU", "count": 1},
                            attached=SimpleNamespace(gpu=None), name=None)
    rec = {**records.hello(probe), "t": t, "host": host, **fields}
    return wire.validate({k: v for k, v in rec.items() if v is not None})


def step(n: int, *, start: float, dur: float, phases: dict[str, float] | None = None, gap: float = 0.0,
         samples: float | None = None, tokens: float | None = None, flops: float | None = None,
         data_cpu: float | None = None, cpu: float | None = None, cpu_span: str | None = records.CPU_SPAN_BODY,
         **extras: Any) -> dict[str, Any]:
    """Step ``n``, ``start`` to ``start + dur`` (unix s). ``phases``: the measured ones (``data``, the
    loader wait, among them); the probe adds ``other``, the rest after them and ``gap``. ``cpu_span``
    None: ``cpu`` without it, as a probe before wire 1.3 sent it. ``extras``: keys the probe adds
    beside (``comm``, ``syncs``, ``gpu_time``, ``cpu_others``, ...)."""
    measured = {k: v for k, v in (phases or {}).items() if k != "other"}
    # the probe's clock reads are perf_counter seconds, turned into unix seconds by its epoch: the
    # step from 0 to ``dur`` on a clock whose epoch is ``start`` keeps ``dur`` exact
    item = records.StepItem(kind=records.ITEM_STEP, step=n, start=0.0, end=dur, data=0.0, phases=measured,
                            samples=samples, tokens=tokens, flops=flops, extras=extras or None, gap=gap,
                            data_cpu=data_cpu, cpu=cpu, cpu_span=cpu_span)
    rec = records.step_record(item, start)
    if rec.get("cpu_span", "") is None:
        del rec["cpu_span"]
    return wire.validate(rec)


def sample(t: float, **fields: Any) -> dict[str, Any]:
    """A sampler record at ``t`` (``host``, ``gpus``, ``cost``, ...)."""
    return wire.validate({"k": "sample", "t": t, **fields})


def memory(t: float, **fields: Any) -> dict[str, Any]:
    """A memory record at ``t`` (``device``, ``rss``, ``limit``, ``allocated``, ...)."""
    return wire.validate({"k": "memory", "t": t, **fields})


def comm(t: float, ops: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    """A comm record at ``t``: the collectives' running totals ``ops`` (``backend``, ``world_size``, ...)."""
    return wire.validate({"k": "comm", "t": t, "ops": ops, **fields})


def event(t: float, name: str, **fields: Any) -> dict[str, Any]:
    """An event at ``t`` (``checkpoint``, ``warning``, ``first_batch``, ..., with its fields)."""
    return wire.validate({"k": "event", "t": t, "name": name, **fields})
