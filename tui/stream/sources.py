"""Frames to records: the decoding side of live streams, and recording files loaded whole.

Both yield validated wire records tagged with the stream they came from, so
the run model does not care whether it is watching a job or a replay. Errors
the user can act on (version mismatch, bad frame, unreadable file) become
``UserError`` / ``StreamError`` with one line; never a traceback.
"""

from __future__ import annotations

import json
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from probe import wire
from probe.recording import RecordingError, read_recording, recording_files
from tui.errors import UserError

VIEWER_HELLO = {"k": "hello", "proto": list(wire.PROTO), "role": "viewer"}


class StreamError(Exception):
    """One stream broke (bad frame, mismatch); ``str()`` is one line."""


def viewer_hello(token: str | None = None) -> bytes:
    rec = dict(VIEWER_HELLO, t=time.time())
    if token:
        rec["token"] = token
    return wire.encode(rec)


@dataclass
class LiveStream:
    """The decoding side of one live connection: frames in, checked records out.

    The bytes come from the one asyncio reader in ``tui.stream.feed`` (Unix socket or TCP)."""

    path: str
    decoder: wire.FrameDecoder = field(default_factory=wire.FrameDecoder)
    hello: dict[str, Any] | None = None
    ended: bool = False       # bye seen

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        """Decode bytes; check the hello; raise StreamError on a protocol problem."""
        try:
            records = list(self.decoder.feed(data))
        except wire.ProtocolError as exc:
            raise StreamError(f"{self.path}: {exc}") from None
        for rec in records:
            if rec["k"] == "hello" and self.hello is None:
                try:
                    wire.check_compatible(rec.get("proto"), we_are="viewer")
                except wire.ProtocolMismatch as exc:
                    raise StreamError(str(exc)) from None
                self.hello = rec
            elif rec["k"] == "bye":
                self.ended = True
        return records


@dataclass
class LoadedRecording:
    path: Path
    records: list[dict[str, Any]]
    problem: str | None   # one line when the file was torn or damaged, else None


def load_recordings(target: str | Path) -> list[LoadedRecording]:
    """Every recording file under ``target`` (file or directory), each read to its intact end."""
    target = Path(target)
    _check_readable(target)
    files = recording_files(target)
    if not files:
        raise UserError(f"{target}: no perfmon recordings (*.pmrec) in it")
    loaded = []
    for path in files:
        try:
            result = read_recording(path)
        except RecordingError as exc:
            raise UserError(str(exc)) from None
        hello = next((r for r in result.records if r["k"] == "hello"), None)
        if hello is not None:
            try:
                wire.check_compatible(hello.get("proto"), we_are="viewer")
            except wire.ProtocolMismatch as exc:
                raise UserError(f"{path}: {exc}") from None
        loaded.append(LoadedRecording(path, result.records, result.message))
    return loaded


EXIT_SUFFIX = ".exit.json"     # ``perfmon run --record DIR``: how the job's command ended, beside its recordings


def exit_path(record_dir: Path, job: str, pid: int) -> Path:
    """Where ``perfmon run`` (pid ``pid``) writes the exit status of job ``job``."""
    return record_dir / f"{job}.run.p{pid}{EXIT_SUFFIX}"


def load_exits(target: str | Path) -> list[dict[str, Any]]:
    """The exit statuses ``perfmon run`` wrote under ``target`` (a recording directory, or the
    directory of a recording file, for that file's job), oldest first; unreadable ones are skipped."""
    target = Path(target)
    folder, job = (target, None) if target.is_dir() else (target.parent, target.name.split(".", 1)[0])
    found = []
    for path in sorted(folder.glob(f"*{EXIT_SUFFIX}")):
        if job is not None and not path.name.startswith(f"{job}.run."):
            continue
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict):
            found.append(record)
    return sorted(found, key=lambda r: float(r["t"]) if isinstance(r.get("t"), (int, float)) else 0.0)


def is_recording_target(target: str) -> bool:
    path = Path(target)
    try:
        mode = path.stat().st_mode
    except PermissionError:
        raise UserError(f"{target}: permission denied (a job or recording of another user?)") from None
    except OSError:
        return False
    return not stat.S_ISSOCK(mode)


def _check_readable(target: Path) -> None:
    """One line, not an empty listing or a traceback, for what this user may not read."""
    try:
        is_dir = target.is_dir()
        exists = is_dir or target.exists()
    except PermissionError:
        raise UserError(f"{target}: permission denied (a recording of another user?)") from None
    if not exists:
        raise UserError(f"{target}: no such file or directory")
    if not os.access(target, os.R_OK | (os.X_OK if is_dir else 0)):
        raise UserError(f"{target}: permission denied (a recording of another user?)")
