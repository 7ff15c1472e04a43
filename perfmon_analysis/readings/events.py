"""What particular events say beyond their name and seconds: an exception's error, step and the user's
line it came from (``probe.exceptions``), the forwards of eval-shaped work (``probe.stepfinder``), and
the exit status ``perfmon run`` leaves beside its recordings (not a wire record: a small JSON file,
read here all the same so its keys have one reader)."""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Any

from perfmon_analysis.readings.base import _int, _text, num
from perfmon_analysis.readings.steps import EventReading


@dataclass(frozen=True)
class ExceptionReading:
    """An ``exception``/``oom`` event: the exception's type name, the steps done before it, and the
    user's line it came from (None where the probe did not send it)."""

    error: str | None
    step: int | None
    file: str | None
    line: int | None
    function: str | None
    call: str | None


def exception_reading(event: EventReading) -> ExceptionReading:
    rec = event.record
    return ExceptionReading(error=_text(rec.get("error")), step=_int(rec.get("step")), file=_text(rec.get("file")),
                            line=_int(rec.get("line")), function=_text(rec.get("function")),
                            call=_text(rec.get("call")))


def eval_forwards(event: EventReading) -> int | None:
    """The training-mode forwards an ``eval`` event of zero-code mode counted (None when not said)."""
    return _int(event.record.get("forwards"))


@dataclass(frozen=True)
class JobExit:
    """How the job's command ended (``perfmon run``): its exit code, or the signal that killed it."""

    code: int | None
    signal: int | None = None
    t: float | None = None

    @property
    def failed(self) -> bool:
        """Not zero, and not the user's interrupt (Ctrl-C: SIGINT, exit status 130)."""
        if self.signal is not None:
            return self.signal != signal.SIGINT
        return bool(self.code) and self.code != 128 + signal.SIGINT

    @property
    def text(self) -> str:
        if self.signal is not None:
            try:
                name = signal.Signals(self.signal).name
            except ValueError:
                name = f"signal {self.signal}"
            return f"killed by {name}"
        return f"exit code {self.code}"


def exit_reading(record: dict[str, Any]) -> JobExit | None:
    """The exit status ``perfmon run`` wrote: ``returncode`` as Python's ``subprocess`` reports it
    (negative when a signal ended the process); None when the record has none."""
    rc = record.get("returncode")
    if not isinstance(rc, int) or isinstance(rc, bool):
        return None
    t = num(record.get("t"))
    return JobExit(None, -rc, t) if rc < 0 else JobExit(rc, None, t)
