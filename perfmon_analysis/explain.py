"""Words the outcomes and findings share (who, where, the MFU's peak, time lost between steps),
and the secondary findings beside the named outcome (gaps, throttling, fragmentation, contention,
restarts, drops, the probe's own cost and failures). Pure: everything comes from the ``JobView``;
every number goes through ``perfmon_analysis.units``."""

from __future__ import annotations

from typing import Any

from perfmon_analysis import units
from perfmon_analysis.buffers import BLOCKING_EVENTS
from perfmon_analysis.flowchart import CPU_CONTENTION_MIN, ETTR_MIN, FRAGMENTATION_MAX, THROTTLE_REASONS, round4
from perfmon_analysis.health_verdict import findings as health_findings
from perfmon_analysis.overhead import finding as overhead_finding
from perfmon_analysis.views import JobView, WhereLine

_pct = units.pct


def peak_note(v: JobView) -> str:
    """'of a 989TFLOP/s peak (device table, bf16)': the number the MFU divides by, and whence."""
    m = v.metrics
    if m.peak_flops is None:
        return ""
    return f"of a {units.rate(m.peak_flops, 'FLOP')} peak ({m.peak_source or 'source unknown'})"


def tensor_active(v: JobView) -> float | None:
    vals = [row.gpu.tensor_active for row in v.gpus if row.gpu.tensor_active is not None]
    return sum(vals) / len(vals) if vals else None


def who(v: JobView, rank: int | None) -> str:
    """'rank 3', or 'rank 3 on n02' when the job spans more than one node."""
    if rank is None:
        return f"rank {units.NA}"
    hosts = {r.host for r in v.ranks if r.host}
    host = next((r.host for r in v.ranks if r.rank == rank), None)
    return f"rank {rank} on {host}" if host and len(hosts) > 1 else f"rank {rank}"


def where_text(line: WhereLine) -> str:
    """'time.sleep(0.05) at train.py:21 in fetch_from_service'."""
    return f"{line.what} at {line.site} in {line.function}"


def gaps_lost(m: Any) -> str | None:
    """How much time pauses between steps take, when it is over the line (ETTR < 90%). The loop's own
    work between steps is a loss of its own, judged by the flowchart (docs/verdict.md, "Between steps")."""
    if m.ettr is not None and m.ettr < ETTR_MIN:
        return (f"only {_pct(m.ettr)} of the time since the first step is in the training loop (ETTR): "
                f"{_pct(1.0 - m.ettr)} is pauses between steps")
    return None


def findings(v: JobView) -> list[dict[str, Any]]:
    """Secondary findings; each dict has ``id`` and its numbers."""
    out: list[dict[str, Any]] = []
    m = v.metrics
    if gaps_lost(m) is not None:
        pauses = [e for e in v.events if e.get("name") in BLOCKING_EVENTS]
        out.append({"id": "step_gaps", "ettr": round4(m.ettr), "gap_frac": round4(m.gap_frac),
                    "pause_frac": round4(m.pause_frac), "events": len(pauses),
                    "message": f"ETTR {_pct(m.ettr)}: time between steps is lost to "
                               f"{'checkpoints/evaluation' if pauses else 'pauses or stalls'}"})
    throttled = sorted({(row.rank, row.gpu.index, reason) for row in v.gpus for reason in row.gpu.throttle
                        if reason in THROTTLE_REASONS}, key=lambda x: (x[0], x[1] if x[1] is not None else -1, x[2]))
    if throttled:
        out.append({"id": "throttling", "gpus": [{"rank": r, "index": i, "reason": why} for r, i, why in throttled],
                    "message": f"{len(throttled)} GPU clock throttle reason(s) active (power/thermal)"})
    mem = m.memory
    if mem.fragmentation_bytes is not None and mem.reserved_bytes:
        frac = mem.fragmentation_bytes / mem.reserved_bytes
        if frac > FRAGMENTATION_MAX:
            out.append({"id": "fragmentation", "fraction": round(frac, 4), "bytes": mem.fragmentation_bytes,
                        "message": f"{_pct(frac)} of reserved memory is fragmented: try expandable_segments:True"})
    if m.cpu_contention_frac is not None and m.cpu_contention_frac >= CPU_CONTENTION_MIN:
        out.append({"id": "cpu_contention", "share": round4(m.cpu_contention_frac),
                    "message": f"the training thread waits {_pct(m.cpu_contention_frac)} of each step for a free "
                               "core: other processes or threads compete for the CPU"})
    for r in v.ranks:
        if r.generation > 0:
            out.append({"id": "rank_restarted", "rank": r.rank, "generation": r.generation, "restart": r.restart,
                        "pid": r.pid, "message": f"rank {r.rank} restarted (generation {r.generation}, pid {r.pid})"})
    if v.drops_total:
        out.append({"id": "drops", "count": v.drops_total,
                    "message": f"{v.drops_total} records dropped on the way; numbers may have holes"})
    cost = overhead_finding(v.overhead)
    if cost is not None:
        out.append(cost)
    probe_warning = _probe_warnings(v.events)
    if probe_warning is not None:
        out.append(probe_warning)
    return out + health_findings(v)


def _probe_warnings(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The probe's own counted failures (``warning`` events with ``source: perfmon``, each carrying
    the running ``count`` for its ``where``): the newest count per rank and place, summed."""
    latest: dict[tuple[Any, str], dict[str, Any]] = {}
    for e in events:
        if e.get("name") == "warning" and e.get("source") == "perfmon":
            latest[(e.get("rank"), str(e.get("where") or units.NA))] = e
    if not latest:
        return None
    total = sum(int(e.get("count") or 1) for e in latest.values())
    where = sorted({w for _, w in latest})
    return {"id": "probe_warnings", "count": total, "where": where,
            "message": f"the probe counted {total} failure(s) of its own ({', '.join(where)}): "
                       "numbers from those parts may be missing"}
