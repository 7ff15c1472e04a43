"""What fixing each loss would buy: an upper bound on the speedup, the device-hours lost, and money.

Every share is of one whole, the iteration over the wall time (docs/verdict.md, "One whole"), so a
loss's share of wall time is its share. A loss of share ``s`` cannot save more than that share, so
removing it makes the job at most ``1 / (1 − s)`` times faster: an upper bound (Nsight's "Est.
Speedup" convention), never a prediction, since the work hidden behind a removed wait may surface
elsewhere. The losses the verdict counts (those over their threshold) are disjoint shares of the
whole, so their combination is ``1 / (1 − Σ s)``, the pauses between steps (over the run) among
them when they are over their line. Communication's bound is of all the time in collectives, exposed or overlapped
(``comm_frac``): an overlapped collective still takes the cores (gloo) or SMs (NCCL) the compute
uses, so removing it can buy more than its exposed share (2-rank gloo DDP with ``no_sync``: 1.80×
measured against 1.53× from the exposed share, bench/RESULTS.md).

Device-hours: each rank holds one device, so the
job loses ``ranks × wall share`` device-hours per hour: ``per_day`` at the window's pace, and
``device_hours`` over the time since the job's first probe started, at the window's shares (an
estimate for a job whose bottleneck changed). Money is device-hours times a price per
device-hour, when one is given. On a GPU, the energy spent in each loss: the GPUs' energy per step
and per sample (NVML's total-energy counter) times the loss's share of wall time, an upper
estimate, since an idle GPU draws less than the window's mean power. An unknown input makes the
figure unknown (None, with the reason), never 0.

Where the verdict names a straggler (a slow worker, a slow stage, rotating imbalance) the loss it
names (the exposed wait) is priced by the what-if instead (``perfmon_analysis.stragglers``): the
measured step over the step simulated without the cause, a prediction from the job's own
operations rather than a bound (``basis`` "simulated"; docs/layout.md).

Pure: ``estimate(view, losses, over)`` depends on its inputs only; the verdict calls it once.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from perfmon_analysis import units
from perfmon_analysis.flowchart import ETTR_MIN
from perfmon_analysis.losses import Loss
from perfmon_analysis.metrics import GAIN_CALLBACKS, gain_callback
from perfmon_analysis.views import JobView

__all__ = ["Gains", "NO_PRICE", "PRICE_ENV", "callback_values", "estimate", "speedup_bound"]

HOURS_PER_DAY = 24.0
GAPS = "step_gaps"
COMM = "comm_exposed"
PRICE_ENV = "PERFMON_PRICE_PER_DEVICE_HOUR"
NO_PRICE = f"no price per device-hour ({PRICE_ENV} or --price-per-device-hour)"
NO_ENERGY_CPU = "energy is measured on GPUs only (NVML's total-energy counter)"
NO_ENERGY_GPU = "the GPUs' total-energy counter was not read (NVML: not supported, or fewer than two samples)"


@dataclass(frozen=True)
class Energy:
    """The job's GPUs' energy over the window (``Metrics.energy_per_*``, ``power_w``); None where unknown."""

    per_step_j: float | None
    per_sample_j: float | None
    per_token_j: float | None
    power_w: float | None
    why_unknown: str | None = None

    def spent(self, wall_share: float | None) -> dict[str, Any] | None:
        """The part of it spent in a loss of ``wall_share``: per step, sample, token, and kWh per day."""
        if wall_share is None or self.power_w is None:
            return None
        return {"per_step_j": _round(_times(self.per_step_j, wall_share)),
                "per_sample_j": _round(_times(self.per_sample_j, wall_share), 8),
                "per_token_j": _round(_times(self.per_token_j, wall_share), 8),
                "per_day_kwh": _round(self.power_w * wall_share * HOURS_PER_DAY / 1000.0)}


@dataclass(frozen=True)
class Gain:
    """What removing one loss (or, for the combination, several) would buy.

    ``speedup_bound``: at most this many times faster; ``wall_share``: the share of the devices'
    wall time the loss takes; ``device_hours``: lost since the job started; ``per_day``: lost per
    day at the window's pace. ``why_unknown``: why a figure is None."""

    loss: str
    label: str
    share: float | None
    speedup_bound: float | None
    wall_share: float | None
    device_hours: float | None
    per_day: float | None
    why_unknown: str | None = None
    of: tuple[str, ...] = ()          # the combination: the losses it removes
    energy: dict[str, Any] | None = None     # ``Energy.spent``: the GPUs' energy in this loss
    why_no_energy: str | None = None
    basis: str = "bound"              # "bound": 1 / (1 - share) | "simulated": the what-if's step without it

    def cost(self, price: float | None) -> tuple[float | None, float | None]:
        """(money lost so far, money lost per day) at ``price`` per device-hour; None where unknown."""
        if price is None:
            return None, None
        return (None if self.device_hours is None else self.device_hours * price,
                None if self.per_day is None else self.per_day * price)

    def as_json(self, price: float | None = None) -> dict[str, Any]:
        """One entry of the report's ``verdict.gains`` (``verdict.gains_combined`` for the combination)."""
        so_far, per_day = self.cost(price)
        out: dict[str, Any] = {
            "loss": self.loss, "label": self.label, "share": _round(self.share),
            "speedup_bound": _round(self.speedup_bound), "wall_share": _round(self.wall_share),
            "device_hours": _round(self.device_hours), "per_day": _round(self.per_day), "basis": self.basis,
            "price": None if price is None else {"per_device_hour": price, "so_far": _round(so_far),
                                                  "per_day": _round(per_day)},
        }
        out["energy"] = self.energy
        if self.energy is None and self.why_no_energy is not None:
            out["why_no_energy"] = self.why_no_energy
        if self.of:
            out["of"] = list(self.of)
        if self.why_unknown is not None:
            out["why_unknown"] = self.why_unknown
        if price is None:
            out["why_no_price"] = NO_PRICE
        return out


@dataclass(frozen=True)
class Gains:
    """Every loss's gain, the combination of those over their threshold, and the device they run on."""

    per_loss: tuple[Gain, ...]
    combined: Gain | None             # None when no measured loss is over its threshold
    device_unit: str                  # "GPU-h" | "CPU-h": what a device-hour is on this job
    ranks: int
    hours: float | None               # wall hours since the job's first probe started
    energy: Energy | None = None

    def of(self, loss_id: str) -> Gain | None:
        return next((g for g in self.per_loss if g.loss == loss_id), None)

    def headline(self, loss_id: str | None, price: float | None = None, compact: bool = False) -> str | None:
        """'fixing it: up to 1.4× faster, 3.1 GPU-h/day' for the named loss (None when unknown);
        ``compact``: 'up to 1.4×, 3.1 GPU-h/day', for a narrow bar."""
        gain = self.of(loss_id) if loss_id else None
        if gain is None or gain.speedup_bound is None:
            return None
        bound = units.speedup(gain.speedup_bound)
        if gain.basis == "simulated":
            text = f"{bound} (sim.)" if compact else f"fixing it: {bound} faster (simulated)"
        else:
            text = f"up to {bound}" if compact else f"fixing it: up to {bound} faster"
        if gain.per_day is not None:
            text += f", {units.hours(gain.per_day)} {self.device_unit}/day"
            _, money = gain.cost(price)
            if money is not None:
                text += f" ({units.money(money)}/day)"
        return text

    def as_json(self, price: float | None = None) -> dict[str, Any]:
        """``{"gains": [...], "gains_combined": {...} | None}`` for the report's verdict."""
        return {"gains": [g.as_json(price) for g in self.per_loss],
                "gains_combined": self.combined.as_json(price) if self.combined is not None else None,
                "gains_basis": {"ranks": self.ranks, "hours": _round(self.hours), "device_unit": self.device_unit,
                                "power_w": _round(self.energy.power_w) if self.energy is not None else None}}


def callback_values(gains: Gains | None) -> dict[str, float]:
    """The trainer callbacks' scalars: ``perfmon/speedup_bound/<loss>`` and
    ``perfmon/device_hours_per_day/<loss>`` (``combined`` too), known values only."""
    if gains is None:
        return {}
    every = (*gains.per_loss, *((gains.combined,) if gains.combined is not None else ()))
    return {gain_callback(field, g.loss): value for g in every for field in GAIN_CALLBACKS
            for value in (getattr(g, field),) if value is not None}


def speedup_bound(share: float | None) -> float | None:
    """1 / (1 − share): the most removing a share of the time can speed it up; None when unknown
    or when the share is the whole time (no finite bound)."""
    if share is None or share >= 1.0:
        return None
    return 1.0 / (1.0 - max(0.0, share))


def estimate(view: JobView, losses: tuple[Loss, ...], over: tuple[str, ...],
             simulated: dict[str, tuple[float | None, str]] | None = None) -> Gains:
    """The gains of ``losses`` (the verdict's accounting); ``over``: ids of the step losses over
    their threshold, whose removal the combination prices (the time between steps joins them when
    it is over its own line); ``simulated``: loss id -> (the what-if's speedup without its cause, why
    it is None), which replaces that loss's bound."""
    ranks = max(1, view.world_size, len(view.ranks))
    hours = (view.now - view.started) / 3600.0 if view.started is not None and view.now >= view.started else None
    unit = "GPU-h" if view.device_type == "cuda" else "CPU-h"
    m = view.metrics
    energy = Energy(m.energy_per_step_j, m.energy_per_sample_j, m.energy_per_token_j, m.power_w,
                    None if m.power_w is not None else NO_ENERGY_GPU if view.device_type == "cuda" else NO_ENERGY_CPU)
    bounding = {COMM: _comm_bounding(losses, m.comm_frac)}
    for loss_id, (speedup, _) in (simulated or {}).items():      # the combination removes the simulated share
        bounding[loss_id] = None if speedup is None else max(0.0, 1.0 - 1.0 / speedup)
    per_loss = tuple(_with_energy(_simulated(x, simulated[x.id], ranks, hours) if simulated and x.id in simulated
                                  else _gain(x.id, x.label, x.share, x.share, ranks, hours, x.source,
                                             bound=speedup_bound(bounding[x.id]) if bounding.get(x.id) is not None
                                             else None), energy)
                     for x in losses)
    combined = _combined(losses, over, ranks, hours, bounding)
    return Gains(per_loss, combined and _with_energy(combined, energy), unit, ranks, hours, energy)


def _simulated(loss: Loss, sim: tuple[float | None, str], ranks: int, hours: float | None) -> Gain:
    """A loss priced by the what-if: its speedup the simulated one, its share of the step what that
    speedup takes off the step (1 - 1/speedup), for the device-hours."""
    speedup, why = sim
    share = None if speedup is None else max(0.0, 1.0 - 1.0 / speedup)
    gain = _gain(loss.id, loss.label, share, share, ranks, hours, why or loss.source, bound=speedup)
    return dataclasses.replace(gain, basis="simulated")


def _comm_bounding(losses: tuple[Loss, ...], comm_frac: float | None) -> float | None:
    """The share that bounds communication's gain: all the time in collectives, never less than the
    exposed share; None (the exposed share's own bound) when either is unknown."""
    exposed = next((x.share for x in losses if x.id == COMM), None)
    if exposed is None or comm_frac is None:
        return None
    return max(exposed, comm_frac)


def _with_energy(gain: Gain, energy: Energy) -> Gain:
    spent = energy.spent(gain.wall_share)
    why = None if spent is not None else energy.why_unknown or "the loss's share of wall time is unknown"
    return dataclasses.replace(gain, energy=spent, why_no_energy=why)


def _gain(loss: str, label: str, share: float | None, wall: float | None, ranks: int, hours: float | None,
          source: str, of: tuple[str, ...] = (), bound: float | None = None) -> Gain:
    bound = speedup_bound(share) if bound is None else bound
    why = None
    if share is None:
        why = source
    elif bound is None:
        why = "the loss is the whole step: no finite bound"
    elif hours is None:
        why = "the job's start time is unknown: device-hours so far cannot be counted"
    per_day = None if wall is None else ranks * HOURS_PER_DAY * wall
    so_far = None if wall is None or hours is None else ranks * hours * wall
    return Gain(loss, label, share, bound, wall, so_far, per_day, why, of)


def _combined(losses: tuple[Loss, ...], over: tuple[str, ...], ranks: int, hours: float | None,
              bounding: dict[str, float | None]) -> Gain | None:
    """Remove every loss over its threshold, the pauses between steps when they are over their line
    (each loss by the share that bounds it)."""
    gap = next((x.share for x in losses if x.id == GAPS), None)
    chosen = [x for x in losses if (x.id in over or (x.id == GAPS and gap is not None and gap >= 1.0 - ETTR_MIN))
              and x.share is not None]
    if not chosen:
        return None
    share = min(1.0, sum(bounding.get(x.id) or x.share or 0.0 for x in chosen))
    return _gain("combined", "every loss over threshold", share, share, ranks, hours,
                 "a loss in the combination is the whole step", tuple(x.id for x in chosen))


def _times(x: float | None, share: float) -> float | None:
    return None if x is None else x * share


def _round(x: float | None, places: int = 4) -> float | None:
    return None if x is None else round(x, places)
