"""The price of a device-hour, for the money the gains put on each loss: the command's
``--price-per-device-hour``, else ``$PERFMON_PRICE_PER_DEVICE_HOUR``, else none (money unknown)."""

from __future__ import annotations

import math
import os

from perfmon_analysis.gains import PRICE_ENV
from tui.errors import UserError


def price_per_device_hour(flag: float | None) -> float | None:
    """The price, or None when neither the flag nor the environment gives one; UserError when bad."""
    if flag is not None:
        return _checked(flag, "--price-per-device-hour")
    raw = os.environ.get(PRICE_ENV, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise UserError(f"{PRICE_ENV}={raw!r} is not a number (a price per device-hour, e.g. 2.5)") from None
    return _checked(value, PRICE_ENV)


def _checked(value: float, where: str) -> float:
    if not math.isfinite(value) or value < 0:
        raise UserError(f"{where} must be a price of zero or more, not {value}")
    return value
