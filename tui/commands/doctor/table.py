"""The doctor's result rows and the table it prints."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    name: str
    expected: str
    measured: str
    ok: bool | None        # None: not run here (``measured`` says why)

    @property
    def verdict(self) -> str:
        return "skip" if self.ok is None else "ok" if self.ok else "FAIL"


def render(checks: list[Check], width: int = 100) -> str:
    """The table: one row per check, columns cut to fit ``width``."""
    w_name = max(len(c.name) for c in checks)
    w_exp = max(len(c.expected) for c in checks)
    room = max(20, width - w_name - w_exp - 12)
    lines = [f"{'check':<{w_name}}  {'expected':<{w_exp}}  {'verdict':<7}  measured"]
    for c in checks:
        measured = c.measured if len(c.measured) <= room else c.measured[:room - 1] + "…"
        lines.append(f"{c.name:<{w_name}}  {c.expected:<{w_exp}}  {c.verdict:<7}  {measured}")
    failed = sum(c.ok is False for c in checks)
    lines.append(f"{len(checks)} checks: {sum(c.ok is True for c in checks)} ok, {failed} failed, "
                 f"{sum(c.ok is None for c in checks)} not run here")
    return "\n".join(lines)
