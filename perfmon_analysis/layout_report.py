"""The report's parallel layout and straggler analysis as text, and each rank's place in its row.

Reads the report dict only (``perfmon_analysis.report.build`` made it), like the rest of the text.
A job that is data parallel and has no straggler named reads as it always did: no section.
"""

from __future__ import annotations

import textwrap
from typing import Any

from perfmon_analysis import units
from perfmon_analysis.layout import Layout
from perfmon_analysis.straggler_verdict import CAUSE_OUTCOMES

__all__ = ["layout_lines", "rank_note", "rank_place"]

CAUSES = {"slow_stage": "slow stage", "slow_worker": "slow worker", "rotating_imbalance": "rotating imbalance"}


def rank_place(layout: Layout, rank: int) -> dict[str, Any]:
    """A rank row's ``stage`` and ``replica`` (and its coordinates by dim) when the layout says more
    than data parallel; nothing otherwise (a data-parallel job's rows read as before)."""
    if not layout.beyond_dp or rank not in layout.coords:
        return {}
    return {"stage": layout.stage(rank), "replica": layout.replica(rank),
            "coord": dict(zip(layout.dims, layout.coords[rank]))}


def rank_note(row: dict[str, Any]) -> str:
    """'pp1 dp0 tp1' for a rank row with a place."""
    coord = row.get("coord")
    return " ".join(f"{d}{c}" for d, c in coord.items()) if isinstance(coord, dict) else ""


def layout_lines(layout: dict[str, Any], s: dict[str, Any] | None, bottleneck: str | None,
                 width: int = 80) -> list[str]:
    """"Parallel layout" (dims and what the what-if found) from the layout's and the straggling's JSON,
    for a job beyond data parallel or whose verdict names a straggler outcome (a data-parallel job
    otherwise reads as it did without it)."""
    layout = layout or {}
    beyond = layout and (len(layout.get("dims", [])) > 1 or layout.get("dims") != ["dp"])
    if not beyond and bottleneck not in CAUSE_OUTCOMES.values():
        return []
    lines = ["", "Parallel layout: " + " x ".join(f"{d}{n}" for d, n in zip(layout["dims"], layout["sizes"]))
             + f" (from the {layout['source']})"]
    if s is None:
        return lines + ["  no rank sent its operations: stragglers not analysed"]
    if s.get("why"):
        return lines + [f"  stragglers not analysed: {s['why']}"]
    lines += _cause_lines(s, width)
    if s.get("stages"):
        lines.append(f"  {'stage':>5} {'compute':>9} {'share':>6} {'bubble':>9} {'share':>6}  attributed")
        for st in s["stages"]:
            attributed = (s.get("by_stage") or {}).get(str(st["stage"]))
            lines.append(f"  {st['stage']:>5} {units.seconds(st['compute_s']):>9} {units.pct(st['compute_frac']):>6} "
                         f"{units.seconds(st['bubble_s']):>9} {units.pct(st['bubble_frac']):>6}  "
                         f"{units.speedup(attributed) if attributed is not None else units.NA}")
        lines.extend(textwrap.wrap("bubble = time a stage is blocked on its neighbours; attributed = the step "
                                   "with only that stage as measured, over the all-typical step", width,
                                   initial_indent="  ", subsequent_indent="    "))
    return lines


def _cause_lines(s: dict[str, Any], width: int) -> list[str]:
    cause = s.get("cause")
    if cause is None:
        text = (f"no straggler over {s['steps']} steps "
                f"(all of them together cost {units.speedup(s.get('whole_slowdown'))})")
        if s.get("one_off"):
            text += f"; a one-off: rank {s['one_off']['rank']} at step {s['one_off']['step']}, not a straggler"
    else:
        where = ""
        if cause == "slow_worker" and s.get("worker"):
            where = f": worker {s['worker'].get('label') or s['worker']} (rank {s['rank']})"
        elif s.get("stage") is not None:
            where = f": stage {s['stage']}" if cause == "slow_stage" else f", stage {s['stage']} the heavier"
        text = (f"{CAUSES[cause]}{where}; costs {units.speedup(s.get('slowdown'))} over a job without stragglers, "
                f"removing it buys {units.speedup(s.get('gain'))} ({s['standout_steps']} of {s['steps']} steps had "
                f"one worker stand out)")
    return textwrap.wrap(text, width, initial_indent="  ", subsequent_indent="    ", break_on_hyphens=False)
