"""A crash ends the story: the exception that ended a rank, where and at which step, or the job's
non-zero exit status (docs/verdict.md, "Crashed").

A rank crashed when its stream ended with an ``exception`` (or ``oom``) event after its last step:
the probe records one from ``sys.excepthook`` (zero-code mode) or when an exception leaves a
``mon.step()`` (API); an exception a step raised that the script caught is followed by more steps
and is not a crash. ``perfmon run`` writes the job's exit status beside its recordings
(``tui.commands.run``); a non-zero status with no exception recorded (``sys.exit(1)``, a signal, a
native crash) is a crash too. An interrupt (Ctrl-C: ``KeyboardInterrupt``, SIGINT) is the user
stopping the job, not a crash.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from perfmon_analysis.readings import JobExit, exception_reading

if TYPE_CHECKING:
    from perfmon_analysis.buffers import RankState

CRASH_EVENTS = ("exception", "oom")
INTERRUPTS = ("KeyboardInterrupt",)


@dataclass(frozen=True)
class Crash:
    """What ended the job: the exception (``error``, ``message``) of ``rank`` at the user's line
    (``file``, ``line``, ``function``, ``call``) after ``step`` steps, and/or its exit status."""

    rank: int | None
    error: str | None
    message: str
    step: int | None
    file: str | None = None
    line: int | None = None
    function: str | None = None
    call: str | None = None
    exit: str | None = None       # "exit code 1", "killed by SIGKILL" (``perfmon run``)

    @property
    def site(self) -> str | None:
        """'train.py:71 in main'."""
        if self.file is None:
            return None
        base = self.file.replace("\\", "/").rsplit("/", 1)[-1]
        return f"{base}:{self.line}" + (f" in {self.function}" if self.function else "")

    @property
    def headline(self) -> str:
        what = self.error or (self.exit or "crashed")
        at = f" at step {self.step}" if self.step is not None else ""
        where = f" ({self.site})" if self.site else ""
        rank = f" on rank {self.rank}" if self.rank is not None and self.error else ""
        tail = f": {self.message}" if self.message else ""
        return f"Crashed: {what}{rank}{at}{where}{tail}"

    def as_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "error": self.error, "message": self.message, "step": self.step,
                "file": self.file, "line": self.line, "function": self.function, "call": self.call,
                "exit": self.exit, "headline": self.headline}


def rank_crash(state: RankState) -> Crash | None:
    """The exception that ended the rank's stream after its last step, None when none did."""
    if not state.ended:
        return None
    last_step = state.steps[-1].t if state.steps else None
    for event in reversed(state.events):
        if event.name not in CRASH_EVENTS:
            continue
        exc = exception_reading(event)
        if exc.error in INTERRUPTS or (last_step is not None and (event.t or 0.0) < last_step):
            return None
        return Crash(state.rank, exc.error or event.name, event.message, exc.step, file=exc.file, line=exc.line,
                     function=exc.function, call=exc.call)
    return None


def job_crash(crashes: Iterable[Crash | None], exit: JobExit | None, steps: int | None) -> Crash | None:
    """The job's crash: the first rank's exception (by rank), with the exit status when it failed;
    a failed exit alone, after ``steps`` steps, when no rank recorded one. A command that exited
    cleanly (or was interrupted) did not crash, whatever a rank recorded."""
    if exit is not None and not exit.failed:
        return None
    first = next((c for c in sorted((c for c in crashes if c is not None), key=lambda c: c.rank or 0)), None)
    failed = exit if exit is not None and exit.failed else None
    if first is not None:
        return Crash(**{**first.__dict__, "exit": failed.text if failed is not None else None})
    if failed is not None:
        return Crash(None, None, "", steps, exit=failed.text)
    return None
