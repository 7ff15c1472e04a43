"""Wire values as typed numbers and strings: the checks every reader shares (a bool is not a number,
a share over 1 is a percent)."""

from __future__ import annotations

from typing import Any


def num(value: Any) -> float | None:
    """A wire number as a float; None for anything else (a bool is not a number here)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _frac(value: Any) -> float | None:
    """0..1 utilisation; a value over 1 is a percent."""
    v = num(value)
    return None if v is None else v / 100.0 if v > 1.0 else v


def _int(value: Any) -> int | None:
    v = num(value)
    return None if v is None else int(v)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def record_time(rec: dict[str, Any]) -> float | None:
    """Any record's probe time ``t`` (unix seconds)."""
    return num(rec.get("t"))


def dropped(rec: dict[str, Any]) -> int:
    """Records a ``drops`` record says the probe dropped (0 when it says nothing usable)."""
    count = _whole(rec.get("count"))
    return count if count is not None and count > 0 else 0


def wire_dict(value: Any) -> dict[str, Any]:
    """A wire map; anything else reads as an empty one."""
    return value if isinstance(value, dict) else {}


def wire_list(value: Any) -> list[Any]:
    """A wire list; anything else reads as an empty one."""
    return value if isinstance(value, list) else []


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _whole(value: Any) -> int | None:
    """An int on the wire (a float or a bool is not a count or an id)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _pos(value: Any) -> float | None:
    v = num(value)
    return v if v is not None and v > 0 else None


def _nonneg(value: Any) -> float | None:
    v = num(value)
    return v if v is not None and v >= 0 else None
