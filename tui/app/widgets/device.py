"""Device pane: per-GPU utilisation history, SM/tensor activity, power, clocks, throttling;
CPU use for CPU jobs, and a plain sentence when there is no GPU to show."""

from __future__ import annotations

from typing import Any

from rich.console import RenderableType
from rich.text import Text

from tui.model.views import JobView
from tui.model.verdict import Verdict
from tui.app.widgets import glyphs, units
from tui.app.widgets.pane import Pane, UiState

BUSY_SOURCE = {"nvml": "NVML util", "step_accounting": "not lost to a measured cause"}


class DevicePane(Pane):
    NAME = "device"

    def draw(self, view: JobView, verdict: Verdict | None, ui: UiState, width: int, height: int) -> RenderableType:
        m = view.metrics
        lines: list[Text] = []
        busy = Text("busy ")
        busy.append_text(glyphs.judged(m.device_busy, "device_busy", units.pct, verdict))
        if m.device_busy_source:
            busy.append(f"  {BUSY_SOURCE.get(m.device_busy_source, m.device_busy_source)}", style=glyphs.DIM)
        elif view.device_type == "cuda":
            busy.append("  GPU activity not measured", style=glyphs.DIM)
        lines.append(busy)
        if m.mfu is not None:
            mfu = Text.assemble("MFU ", (units.pct(m.mfu), "bold"))
            if m.peak_flops:
                mfu.append(f"  of {m.peak_flops / 1e12:.3g} TFLOP/s ({m.peak_source})", style=glyphs.DIM)
            lines.append(mfu)
        gpu_rows = _gpu_rows(view)
        if view.device_type == "cuda" or gpu_rows:
            lines.extend(_draw_gpus(view, gpu_rows, width, height - len(lines)))
        else:
            lines.extend(_draw_cpu(view, width, height - len(lines)))
        return lines[:height]


def _gpu_rows(view: JobView) -> list[tuple[int, dict[str, Any]]]:
    """(rank, gpu) for each distinct GPU the ranks report: a rank's own GPU (index = local_rank) first."""
    seen: set[tuple[str | None, Any]] = set()
    rows = []
    for rank in sorted(view.gpus):
        hello = view.hellos.get(rank, {})
        host = hello.get("host")
        local = hello.get("local_rank", 0)
        gpus = [g for g in view.gpus[rank] if isinstance(g, dict)]
        mine = [g for g in gpus if g.get("index") == local] or gpus
        for gpu in mine:
            key = (host, gpu.get("index"))
            if key not in seen:
                seen.add(key)
                rows.append((rank, gpu))
    return rows


def _history(view: JobView, rank: int, pick) -> list[float | None]:
    out = []
    for sample in view.sample_history.get(rank, []):
        out.append(pick(sample))
    return out


def _util(value: Any) -> float | None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    return value / 100.0 if value > 1.0 else float(value)


def _draw_gpus(view: JobView, rows: list[tuple[int, dict[str, Any]]], width: int, height: int) -> list[Text]:
    if not rows:
        status = _gpu_status(view) or "no GPU samples yet"
        return [Text(status, style=glyphs.WARN)]
    lines: list[Text] = []
    per_gpu = 2 if height >= 2 * len(rows) else 1
    for rank, gpu in rows:
        index = gpu.get("index")
        util = _util(gpu.get("util"))
        hist = _history(view, rank, lambda s, i=index: _util(next(
            (g.get("util") for g in (s.get("gpus") or []) if isinstance(g, dict) and g.get("index") == i), None)))
        head = Text.assemble((f"GPU{index} ", "bold"))
        head.append(f"{units.pct(util):>4} ")
        spark_w = max(4, width - 10)
        head.append(glyphs.sparkline(hist, spark_w, 0.0, 1.0), style=glyphs.ACCENT)
        lines.append(head)
        if per_gpu == 1:
            continue
        detail = Text("  ")
        for label, key in (("SM", "sm_active"), ("TC", "tensor_active")):
            value = _util(gpu.get(key))
            if value is not None:
                detail.append(f"{label} {units.pct(value)}  ")
        power, limit = gpu.get("power_w"), gpu.get("power_limit_w")
        if power is not None:
            detail.append(f"{power:.0f}" + (f"/{limit:.0f}W  " if limit else "W  "))
        clock = gpu.get("sm_clock")
        if clock is not None:
            detail.append(f"{clock:.0f}MHz  ")
        used, total = gpu.get("mem_used"), gpu.get("mem_total")
        if used is not None and total:
            detail.append(f"mem {units.nbytes(used)}/{units.nbytes(total)}  ")
        if gpu.get("temp_c") is not None:
            detail.append(f"{gpu['temp_c']:.0f}°C  ")
        throttle = [t for t in (gpu.get("throttle") or []) if isinstance(t, str)]
        if throttle:
            detail.append("throttled: " + ",".join(throttle), style=glyphs.BAD)
        lines.append(detail)
    return lines


def _gpu_status(view: JobView) -> str | None:
    for rank in sorted(view.hellos):
        device = view.hellos[rank].get("device") or {}
        if isinstance(device, dict) and device.get("status"):
            return str(device["status"])
    for rank in sorted(view.sample_history):
        for sample in reversed(view.sample_history[rank]):
            if sample.get("gpu_status"):
                return str(sample["gpu_status"])
    return None


def _draw_cpu(view: JobView, width: int, height: int) -> list[Text]:
    lines: list[Text] = []
    status = _gpu_status(view)
    note = Text.assemble(("CPU job", "bold"))
    note.append(f" ({view.device_name})" if view.device_name else "", style=glyphs.DIM)
    lines.append(note)
    if status:
        lines.append(Text(status, style=glyphs.DIM))
    ranks = sorted(view.host)
    cpu_count = next((view.host[r].get("cpu_count") for r in ranks if view.host[r].get("cpu_count")), None)
    room = height - len(lines) - 1          # the node line stays
    shown = ranks if len(ranks) <= room else ranks[:max(0, room - 1)]
    for rank in shown:
        host = view.host[rank]
        cpu = host.get("cpu")
        hist = _history(view, rank, lambda s: (s.get("host") or {}).get("cpu"))
        row = Text.assemble((f"r{rank} cpu ", "bold"))
        row.append(f"{cpu:4.1f} " if isinstance(cpu, (int, float)) else " n/a ")
        row.append("cores ", style=glyphs.DIM)
        top = float(cpu_count or max([v for v in hist if v is not None] + [1.0]))
        row.append(glyphs.sparkline(hist, max(4, width - len(row.plain)), 0.0, top), style=glyphs.ACCENT)
        lines.append(row)
    if len(shown) < len(ranks) and len(lines) < height - 1:
        lines.append(Text(f"+{len(ranks) - len(shown)} more ranks (see the ranks pane)", style=glyphs.DIM))
    if ranks and len(lines) < height:
        host = view.host[ranks[0]]
        sys_cpu = host.get("sys_cpu")
        tail = Text.assemble(("node ", "bold"))
        tail.append(f"{units.pct(sys_cpu)} of {cpu_count or '?'} cores busy", style="")
        lines.append(tail)
    return lines
