"""Append-only recording files: the wire frames plus a CRC32 each.

Layout: an 8-byte magic ``PMREC\\x00\\x01\\n`` (format version 1), then records
``[u32 length][u32 crc32(body)][body]`` where ``body`` is the msgpack map of a
wire frame. A writer killed mid-record leaves a short tail ("truncated"); a
flipped bit fails the CRC ("corrupt"). The reader returns the intact prefix in
both cases and says where and why it stopped (TFRecord's reader makes the same
distinction). Writes go straight to the fd with ``os.write`` so a forked child
that closes the fd can never flush a half-written Python buffer into the file.
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from probe import wire
from probe.paths import RECORD_SUFFIX

MAGIC = b"PMREC\x00\x01\n"
REC_HEADER = struct.Struct(">II")


class RecordingError(Exception):
    """The file is not a perfmon recording at all (one line for the user)."""


def _write_all(fd: int, data: bytes) -> int:
    """Write all of ``data``: os.write may take only part of it (a signal, a full disk)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    return len(data)


class RecordingWriter:
    """Writes frames to one file; owned by the sender thread."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        if os.fstat(self.fd).st_size == 0:
            _write_all(self.fd, MAGIC)
        self.bytes_written = 0

    @staticmethod
    def wrap(frame: bytes) -> bytes:
        """Turn a wire frame (length + body) into a recorded record (length + crc + body)."""
        body = memoryview(frame)[wire.HEADER.size:]
        return REC_HEADER.pack(len(body), zlib.crc32(body)) + body

    def write(self, chunk: bytes) -> None:
        self.bytes_written += _write_all(self.fd, chunk)

    def close(self) -> None:
        if self.fd >= 0:
            try:
                os.fsync(self.fd)
            except OSError:
                pass
            os.close(self.fd)
            self.fd = -1

    def abandon(self) -> None:
        """Close without flushing anything (forked child)."""
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = -1


@dataclass
class ReadResult:
    path: Path
    records: list[dict[str, Any]] = field(default_factory=list)
    stopped_at: int | None = None   # byte offset of the first unusable record, None if clean
    problem: str | None = None      # "truncated" | "corrupt" | None
    message: str | None = None      # one line for the user
    skipped: int = 0                # records of kinds newer than this reader (wire.UnknownKind)

    @property
    def clean(self) -> bool:
        return self.problem is None


def read_recording(path: Path | str) -> ReadResult:
    """Read every intact record of a recording; never returns damaged data."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise RecordingError(f"{path}: no such file") from None
    except PermissionError:
        raise RecordingError(f"{path}: permission denied") from None
    except IsADirectoryError:
        raise RecordingError(f"{path}: is a directory") from None
    if not data.startswith(MAGIC[:6]):
        if len(data) < len(MAGIC) and MAGIC.startswith(data):
            return ReadResult(path, stopped_at=0, problem="truncated",
                              message=f"{path}: truncated before the first record (offset 0)")
        raise RecordingError(f"{path}: not a perfmon recording")
    if data[6:8] != MAGIC[6:8]:
        raise RecordingError(f"{path}: recording format {data[6]} is not supported (this perfmon reads 1)")
    result = ReadResult(path)
    pos = len(MAGIC)
    end = len(data)
    while pos < end:
        if end - pos < REC_HEADER.size:
            return _stop(result, pos, "truncated", f"torn tail: {end - pos} bytes of a record header")
        length, crc = REC_HEADER.unpack_from(data, pos)
        if length > wire.MAX_FRAME:
            return _stop(result, pos, "corrupt", f"record length {length} over the frame limit")
        body_start = pos + REC_HEADER.size
        if end - body_start < length:
            return _stop(result, pos, "truncated", f"torn tail: {end - body_start} of {length} bytes")
        body = data[body_start:body_start + length]
        if zlib.crc32(body) != crc:
            return _stop(result, pos, "corrupt", "checksum mismatch")
        try:
            result.records.append(wire.decode_body(body))
        except wire.UnknownKind:
            result.skipped += 1      # a newer minor version's record: intact, just not ours to read
        except wire.ProtocolError as exc:
            return _stop(result, pos, "corrupt", str(exc))
        pos = body_start + length
    return result


def _stop(result: ReadResult, pos: int, problem: str, detail: str) -> ReadResult:
    result.stopped_at = pos
    result.problem = problem
    kept = len(result.records)
    result.message = f"{result.path}: {problem} record at offset {pos} ({detail}); kept {kept} records before it"
    return result


def recording_files(path: Path | str) -> list[Path]:
    """The recording files under a file or directory path, sorted."""
    path = Path(path)
    if path.is_dir():
        return sorted(p for p in path.rglob(f"*{RECORD_SUFFIX}") if p.is_file())
    return [path]
