"""Number formatting for every number a person reads (panes, verdict, report), so a unit reads
the same everywhere: SI prefixes written against the unit, no space ('3.2GB', '12.3GB/s').

Unknown values (``None``) print as ``n/a``: a pane never invents a number.
"""

from __future__ import annotations

__all__ = [
    "NA", "age", "bandwidth", "change", "count", "energy", "fixed", "hours", "money", "nbytes", "number", "pct",
    "points", "rate", "ratio", "seconds", "speedup",
]

NA = "n/a"


def pct(frac: float | None, digits: int = 0) -> str:
    """0.381 -> '38%'."""
    return NA if frac is None else f"{frac * 100:.{digits}f}%"


def seconds(value: float | None) -> str:
    """Durations from microseconds to hours, three significant figures at most."""
    if value is None:
        return NA
    v = abs(value)
    if v < 1e-3:
        return f"{value * 1e6:.0f}µs"
    if v < 1.0:
        return f"{value * 1e3:.3g}ms"
    if v < 120:
        return f"{value:.3g}s"
    if v < 7200:
        return f"{value / 60:.0f}m"
    return f"{value / 3600:.1f}h"


def age(value: float | None) -> str:
    """Elapsed time for humans: '42s', '5m', '1h20m'."""
    if value is None:
        return NA
    v = int(max(0.0, value))
    if v < 60:
        return f"{v}s"
    if v < 3600:
        return f"{v // 60}m{v % 60:02d}s"
    return f"{v // 3600}h{(v % 3600) // 60:02d}m"


def nbytes(value: float | None) -> str:
    """Decimal units, as the verdict's headlines print them: 1.5e3 -> '1.5kB', 3.2e9 -> '3.2GB'."""
    if value is None:
        return NA
    v, prefix = _si(float(value), ("", "k", "M", "G", "T"))
    return f"{v:.0f}B" if not prefix else f"{v:.1f}{prefix}B"


def _si(v: float, prefixes: tuple[str, ...]) -> tuple[float, str]:
    for prefix in prefixes[:-1]:
        if abs(v) < 999.5:      # 999.96 prints as 1e+03 with 3 significant digits: the next prefix
            return v, prefix
        v /= 1000
    return v, prefixes[-1]


def rate(value: float | None, unit: str = "") -> str:
    """Per-second rates with SI prefixes: 1520 -> '1.52k/s'."""
    if value is None:
        return NA
    v, prefix = _si(float(value), ("", "k", "M", "G", "T"))
    return f"{v:.3g}{prefix}{unit}/s"


def count(value: float | None) -> str:
    """Plain counts with SI prefixes (parameters, FLOPs): 16512 -> '16.5k'."""
    if value is None:
        return NA
    v, prefix = _si(float(value), ("", "k", "M", "G", "T", "P"))
    return f"{v:.3g}{prefix}"


def bandwidth(value: float | None) -> str:
    """Bytes per second in decimal units, as nccl-tests prints busbw: '12.3GB/s'."""
    if value is None:
        return NA
    v, prefix = _si(float(value), ("", "k", "M", "G", "T"))
    return f"{v:.3g}{prefix}B/s"


def number(value: float | None, digits: int = 3) -> str:
    if value is None:
        return NA
    return f"{value:.{digits}g}"


def ratio(value: float | None, digits: int = 2) -> str:
    """Ratios to a fixed number of places, so a column of them lines up: 0.5 -> '0.50'."""
    return NA if value is None else f"{value:.{digits}f}"


def fixed(value: float | None, unit: str = "", digits: int = 0) -> str:
    """A reading in a unit without prefixes (watts, MHz, °C, cores): 349.6, 'W' -> '350W'."""
    return NA if value is None else f"{value:.{digits}f}{unit}"


def speedup(value: float | None) -> str:
    """A speedup factor: 1.43 -> '1.4×', 1.053 -> '1.05×' (a small gain keeps its digit), 12.5 -> '12×'."""
    if value is None:
        return NA
    digits = 2 if value < 1.1 else 1 if value < 10 else 0
    return f"{value:.{digits}f}×"


def hours(value: float | None) -> str:
    """Device-hours, two significant figures below 100: 3.14 -> '3.1', 0.042 -> '0.042', 1234 -> '1234'."""
    return NA if value is None else f"{value:.2g}" if abs(value) < 100 else f"{value:.0f}"


def money(value: float | None) -> str:
    """An amount in the currency of the price given (no symbol: perfmon does not know it): '31.2'."""
    return NA if value is None else f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"


def energy(value: float | None) -> str:
    """Joules with SI prefixes: 0.35 -> '350mJ', 1520 -> '1.52kJ'."""
    if value is None:
        return NA
    if abs(value) < 1.0:
        return f"{value * 1e3:.3g}mJ"
    v, prefix = _si(float(value), ("", "k", "M", "G"))
    return f"{v:.3g}{prefix}J"


def change(frac: float | None, digits: int = 0) -> str:
    """A relative change with its sign: 0.41 -> '+41%', -0.032 -> '-3%'."""
    return NA if frac is None else f"{frac * 100:+.{digits}f}%"


def points(frac: float | None, digits: int = 0) -> str:
    """A change of a share in percentage points: 0.25 -> '+25 pts'."""
    return NA if frac is None else f"{frac * 100:+.{digits}f} pts"
