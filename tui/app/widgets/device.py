"""Device pane: busy in time and SM fill (two questions the verdict answers), why busy is not measured
where it is not (per rank, NVML's words), the host's lead, per-GPU utilisation history, SM/tensor
activity, power, clocks, throttling; CPU use for CPU jobs, and a plain sentence when there is no GPU
to show."""

from __future__ import annotations

from rich.console import RenderableType
from rich.text import Text

from perfmon_analysis import units
from perfmon_analysis.verdict import Verdict
from perfmon_analysis.views import JobView
from tui.app.widgets import glyphs
from tui.app.widgets.pane import Pane, UiState

# short forms of perfmon_analysis.losses.BUSY_SOURCES for the pane
BUSY_SOURCE = {"nvml_util": "time a kernel ran (NVML util)", "cuda_timeline": "steps queued whole (CUDA events)",
               "thread_cpu": "training thread CPU time",
               "step_accounting": "not lost to a measured cause"}


class DevicePane(Pane):
    NAME = "device"

    def draw(self, view: JobView, verdict: Verdict | None, ui: UiState, width: int,
             height: int) -> list[Text] | RenderableType:
        m = view.metrics
        lines: list[Text] = []
        busy = Text("busy ")
        busy.append_text(glyphs.judged(verdict, "device_busy", units.pct))
        if m.device_busy_source:
            busy.append(f"  {BUSY_SOURCE.get(m.device_busy_source, m.device_busy_source)}", style=glyphs.DIM)
        elif view.device_type == "cuda":
            busy.append("  not measured in time", style=glyphs.DIM)
        lines.append(busy)
        for rank, why in sorted((m.device_busy_unknown or {}).items()):
            lines.append(Text(f"  r{rank} busy not measured: {why}", style=glyphs.WARN))
        if view.device_type == "cuda":
            lines.extend(_fill_and_lead(view, verdict))
        if m.mfu is not None:
            mfu = Text.assemble("MFU ", (units.pct(m.mfu), "bold"))
            if m.peak_flops:
                mfu.append(f"  of {units.rate(m.peak_flops, 'FLOP')} ({m.peak_source})", style=glyphs.DIM)
            lines.append(mfu)
        if view.device_type == "cuda":
            lines.extend(_draw_gpus(view, width, height - len(lines)))
        else:
            lines.extend(_draw_cpu(view, width, height - len(lines)))
        return lines[:height]


def _fill_and_lead(view: JobView, verdict: Verdict | None) -> list[Text]:
    """Fill (SM activity over busy, GPM) as the verdict judged it, the share of parameters in host
    memory, and the host's lead, timed on about ten steps a second (the others record no event)."""
    m = view.metrics
    lines = []
    if m.device_fill is not None:
        fill = Text("fill ")
        fill.append_text(glyphs.judged(verdict, "fill", units.pct))
        fill.append(f"  SM activity {units.pct(m.sm_active)} / busy", style=glyphs.DIM)
        lines.append(fill)
    if m.params_offloaded:
        lines.append(Text(f"params in host memory {units.pct(m.params_offloaded)}", style=glyphs.DIM))
    if m.host_lead_s is not None:
        lead = Text(f"host lead {units.seconds(m.host_lead_s)}")
        if m.device_time_median_s is not None:
            lead.append(f" of {units.seconds(m.device_time_median_s)} a step on the device", style=glyphs.DIM)
        lead.append("  (CUDA events, ~10 steps/s)", style=glyphs.DIM)
        lines.append(lead)
    return lines


def _draw_gpus(view: JobView, width: int, height: int) -> list[Text]:
    if not view.gpus:
        return [Text(view.device_status or "no GPU samples yet", style=glyphs.WARN)]
    lines: list[Text] = []
    per_gpu = 2 if height >= 2 * len(view.gpus) else 1
    for row in view.gpus:
        gpu = row.gpu
        head = Text.assemble((f"GPU{gpu.index if gpu.index is not None else units.NA} ", "bold"))
        head.append(f"{units.pct(gpu.util):>4} ")
        spark_w = max(4, width - 10)
        head.append(glyphs.sparkline(list(row.util_history), spark_w, 0.0, 1.0), style=glyphs.ACCENT)
        lines.append(head)
        if per_gpu == 1:
            continue
        detail = Text("  ")
        for label, value in (("SM", gpu.sm_active), ("TC", gpu.tensor_active)):
            if value is not None:
                detail.append(f"{label} {units.pct(value)}  ")
        if gpu.power_w is not None:
            limit = f"/{units.fixed(gpu.power_limit_w)}" if gpu.power_limit_w else ""
            detail.append(f"{units.fixed(gpu.power_w)}{limit}W  ")
        if gpu.sm_clock_mhz is not None:
            detail.append(f"{units.fixed(gpu.sm_clock_mhz, 'MHz')}  ")
        if gpu.mem_used is not None and gpu.mem_total:
            detail.append(f"mem {units.nbytes(gpu.mem_used)}/{units.nbytes(gpu.mem_total)}  ")
        if gpu.temp_c is not None:
            detail.append(f"{units.fixed(gpu.temp_c, '°C')}  ")
        if gpu.throttle:
            detail.append("throttled: " + ",".join(gpu.throttle), style=glyphs.BAD)
        lines.append(detail)
    return lines


def _draw_cpu(view: JobView, width: int, height: int) -> list[Text]:
    lines: list[Text] = []
    note = Text.assemble(("CPU job", "bold"))
    note.append(f" ({view.device_name})" if view.device_name else "", style=glyphs.DIM)
    lines.append(note)
    if view.gpus:     # the host's GPUs are a fact about the machine, not this job's device
        names = sorted({row.gpu.name for row in view.gpus if row.gpu.name})
        lines.append(Text(f"host GPUs: {len(view.gpus)}{' ' + names[0] if len(names) == 1 else ''}, "
                          "not used by this job", style=glyphs.DIM))
    elif view.device_status:
        lines.append(Text(view.device_status, style=glyphs.DIM))
    ranks = sorted(view.hosts)
    cpu_count = next((view.hosts[r].cpu_count for r in ranks if view.hosts[r].cpu_count), None)
    room = height - len(lines) - 1          # the node line stays
    shown = ranks if len(ranks) <= room else ranks[:max(0, room - 1)]
    for rank in shown:
        cpu = view.hosts[rank].cpu
        trace = view.traces.get(rank)
        hist = list(trace.cpu) if trace is not None else []
        row = Text.assemble((f"r{rank} cpu ", "bold"))
        row.append(f"{units.fixed(cpu, digits=1):>4} ")
        row.append("cores ", style=glyphs.DIM)
        top = float(cpu_count or max([v for v in hist if v is not None] + [1.0]))
        row.append(glyphs.sparkline(hist, max(4, width - len(row.plain)), 0.0, top), style=glyphs.ACCENT)
        lines.append(row)
    if len(shown) < len(ranks) and len(lines) < height - 1:
        lines.append(Text(f"+{len(ranks) - len(shown)} more ranks (see the ranks pane)", style=glyphs.DIM))
    if ranks and len(lines) < height:
        tail = Text.assemble(("node ", "bold"))
        tail.append(f"{units.pct(view.hosts[ranks[0]].sys_cpu)} of {cpu_count or units.NA} cores busy", style="")
        lines.append(tail)
    return lines
