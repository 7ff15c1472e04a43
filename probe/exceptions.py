"""The ``exception``/``oom`` event of an exception that ends a step or the script: what it was, the
user's line it came from and the step it happened at, so the report can tell the story of a crash
(``perfmon_analysis.crash``)."""

from __future__ import annotations

from types import CodeType
from typing import Any

MESSAGE_CHARS = 300


def exception_event(et: Any, ev: Any, tb: Any, step: int) -> dict[str, Any]:
    """The event's fields: ``error`` (the type's name), ``message``, ``step`` (steps done before it), and
    ``file``/``line``/``function``/``call`` of the innermost frame of the traceback in the user's code
    (the standard library, installed packages and perfmon are not: ``probe.where.Places``), else the
    innermost frame. Never raises: a field it cannot read is left out."""
    name = getattr(et, "__name__", "Exception")
    kind = "oom" if "OutOfMemory" in name or name == "MemoryError" else "exception"
    fields: dict[str, Any] = {"name": kind, "error": name, "message": str(ev)[:MESSAGE_CHARS], "step": step}
    try:
        fields.update(_site(tb if tb is not None else getattr(ev, "__traceback__", None)))
    except Exception:
        pass
    return fields


def _site(tb: Any) -> dict[str, Any]:
    from probe.where import Places, source_line

    entries: list[tuple[CodeType, int]] = []
    while tb is not None and len(entries) < 1000:
        entries.append((tb.tb_frame.f_code, tb.tb_lineno))
        tb = tb.tb_next
    if not entries:
        return {}
    places = Places()
    code, line = next(((c, n) for c, n in reversed(entries) if places.is_user(c.co_filename)), entries[-1])
    site: dict[str, Any] = {"file": code.co_filename, "line": line, "function": code.co_name}
    call = source_line(code.co_filename, line)
    if call:
        site["call"] = call
    return site
