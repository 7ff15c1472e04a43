"""Recording files: a torn tail keeps the intact prefix; a flipped bit is corruption, never data."""

from __future__ import annotations

from pathlib import Path

import pytest

from probe import wire
from probe.recording import MAGIC, RecordingError, RecordingWriter, read_recording

RECORDS = [{"k": "hello", "t": 1.0, "proto": [1, 0], "job": "rec"}] + [
    {"k": "step", "t": 2.0 + i, "step": i, "dur": 0.01 * (i + 1), "phases": {"data": 0.001}} for i in range(20)]


def write(path: Path, records=RECORDS) -> list[int]:
    """Write records; return the file offset where each record starts."""
    writer = RecordingWriter(path)
    enc = wire.Encoder()
    offsets = []
    for rec in records:
        offsets.append(len(MAGIC) + writer.bytes_written)
        writer.write(RecordingWriter.wrap(enc.frame(rec)))
    writer.close()
    return offsets


def test_clean_file_reads_back_every_record(tmp_path):
    path = tmp_path / "a.pmrec"
    write(path)
    result = read_recording(path)
    assert result.clean and result.records == RECORDS and result.message is None


def test_every_truncation_in_the_last_three_records_keeps_exactly_the_complete_prefix(tmp_path):
    path = tmp_path / "a.pmrec"
    offsets = write(path)
    data = path.read_bytes()
    for cut in range(offsets[-3], len(data)):
        path.write_bytes(data[:cut])
        result = read_recording(path)
        complete = sum(1 for off in offsets[1:] + [len(data)] if off <= cut)
        assert result.records == RECORDS[:complete], cut
        if cut in offsets:
            assert result.clean
        else:
            assert result.problem == "truncated"
            assert result.stopped_at == max(o for o in offsets if o <= cut)
            assert "truncated record at offset" in result.message and "\n" not in result.message


def test_a_flipped_bit_is_reported_as_corruption_at_its_record_and_never_returned(tmp_path):
    path = tmp_path / "a.pmrec"
    offsets = write(path)
    data = bytearray(path.read_bytes())
    target = 7
    for bit in range(8):
        damaged = bytearray(data)
        damaged[offsets[target] + 12] ^= 1 << bit  # inside the body of record 7
        path.write_bytes(bytes(damaged))
        result = read_recording(path)
        assert result.problem == "corrupt"
        assert result.stopped_at == offsets[target]
        assert result.records == RECORDS[:target]
        assert f"corrupt record at offset {offsets[target]}" in result.message


def test_flipped_bits_anywhere_after_the_header_never_yield_wrong_records(tmp_path):
    path = tmp_path / "a.pmrec"
    write(path)
    data = path.read_bytes()
    for pos in range(len(MAGIC), len(data), 5):
        damaged = bytearray(data)
        damaged[pos] ^= 0x10
        path.write_bytes(bytes(damaged))
        result = read_recording(path)
        assert result.records == RECORDS[:len(result.records)]
        assert not result.clean


def test_not_a_recording_and_wrong_format_version_are_one_line_errors(tmp_path):
    other = tmp_path / "notes.txt"
    other.write_text("hello world, not a recording")
    with pytest.raises(RecordingError, match="not a perfmon recording"):
        read_recording(other)
    future = tmp_path / "future.pmrec"
    future.write_bytes(MAGIC[:6] + b"\x09\n")
    with pytest.raises(RecordingError, match="format 9 is not supported"):
        read_recording(future)
    with pytest.raises(RecordingError, match="no such file"):
        read_recording(tmp_path / "missing.pmrec")


def test_writer_appends_to_an_existing_file_without_a_second_header(tmp_path):
    path = tmp_path / "a.pmrec"
    write(path, RECORDS[:3])
    write(path, RECORDS[3:6])
    assert read_recording(path).records == RECORDS[:6]


def test_abandon_closes_the_file_without_writing_and_is_idempotent(tmp_path):
    path = tmp_path / "child.pmrec"
    writer = RecordingWriter(path)
    writer.abandon()
    assert writer.fd == -1
    writer.abandon()                      # a second call touches no descriptor
    writer.close()
    assert writer.fd == -1 and path.read_bytes() == MAGIC


def test_close_is_idempotent_and_counts_what_was_written(tmp_path):
    path = tmp_path / "a.pmrec"
    writer = RecordingWriter(path)
    chunk = RecordingWriter.wrap(wire.encode({"k": "bye", "t": 1.0}))
    writer.write(chunk)
    assert writer.bytes_written == len(chunk)
    writer.close()
    writer.close()
    assert writer.fd == -1
    assert read_recording(path).records == [{"k": "bye", "t": 1.0}]
    assert oct(path.stat().st_mode & 0o777) == oct(0o600)


def test_unreadable_paths_are_one_line_errors(tmp_path, monkeypatch):
    with pytest.raises(RecordingError, match="is a directory$"):
        read_recording(tmp_path)
    path = tmp_path / "locked.pmrec"
    write(path, RECORDS[:1])

    def denied(self):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "read_bytes", denied)     # root reads any mode: simulate a foreign 0600 file
    with pytest.raises(RecordingError, match=r"locked\.pmrec: permission denied$"):
        read_recording(path)


def test_file_cut_inside_the_magic_is_a_truncated_empty_recording(tmp_path):
    path = tmp_path / "cut.pmrec"
    path.write_bytes(MAGIC[:3])
    result = read_recording(path)
    assert (result.path, result.records, result.stopped_at, result.problem) == (path, [], 0, "truncated")
    assert result.message == f"{path}: truncated before the first record (offset 0)"


def test_record_with_a_good_checksum_but_a_bad_body_is_corruption(tmp_path):
    import struct
    import zlib

    import msgpack
    path = tmp_path / "bad.pmrec"
    offsets = write(path, RECORDS[:2])
    body = msgpack.packb([1, 2, 3])
    with open(path, "ab") as f:
        f.write(struct.pack(">II", len(body), zlib.crc32(body)) + body)
    end = path.stat().st_size - len(body) - 8
    result = read_recording(path)
    assert result.records == RECORDS[:2] and (result.problem, result.stopped_at) == ("corrupt", end)
    assert result.message == f"{path}: corrupt record at offset {end} (frame is not a map); kept 2 records before it"
    assert offsets[0] == len(MAGIC)


def test_close_and_abandon_survive_os_errors(tmp_path, monkeypatch):
    import os

    writer = RecordingWriter(tmp_path / "a.pmrec")
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(5, "I/O error")))
    writer.close()                                   # fsync failed: the fd is still closed
    assert writer.fd == -1
    other = RecordingWriter(tmp_path / "b.pmrec")
    real_close = os.close
    fd = other.fd

    def failing_close(n):       # the writer's own fd only: another thread may close one of its own meanwhile
        real_close(n)
        if n == fd:
            raise OSError(9, "Bad file descriptor")

    monkeypatch.setattr(os, "close", failing_close)
    other.abandon()
    monkeypatch.undo()
    assert other.fd == -1 and fd >= 0


def _stop_of(path: Path, tail: bytes):
    offsets = write(path, RECORDS[:2])
    with open(path, "ab") as f:
        f.write(tail)
    return offsets, path.stat().st_size - len(tail)


@pytest.mark.parametrize("tail,problem,detail", [
    (b"\x00\x00\x00", "truncated", "torn tail: 3 bytes of a record header"),
    (b"\x00\x00\x00\x10\x00\x00\x00\x00", "truncated", "torn tail: 0 of 16 bytes"),
    (b"\x00\x00\x00\x10\x00\x00\x00\x00abc", "truncated", "torn tail: 3 of 16 bytes"),
    (b"\x00\x10\x00\x01\x00\x00\x00\x00", "corrupt", f"record length {wire.MAX_FRAME + 1} over the frame limit"),
    (b"\x00\x00\x00\x02\x00\x00\x00\x00\x81\xa1", "corrupt", "checksum mismatch"),
])
def test_each_stop_says_where_what_and_how_many_records_were_kept(tmp_path, tail, problem, detail):
    path = tmp_path / "r.pmrec"
    _, end = _stop_of(path, tail)
    result = read_recording(path)
    assert result.records == RECORDS[:2] and (result.problem, result.stopped_at) == (problem, end)
    assert result.message == f"{path}: {problem} record at offset {end} ({detail}); kept 2 records before it"


def test_a_record_of_exactly_the_frame_limit_is_read(tmp_path):
    path = tmp_path / "big.pmrec"
    enc = wire.Encoder()
    base = len(enc.frame({"k": "event", "t": 0.0, "name": "x", "blob": b""})) - 4
    big = {"k": "event", "t": 0.0, "name": "x", "blob": b"\0" * (wire.MAX_FRAME - base - 3)}
    writer = RecordingWriter(path)
    writer.write(RecordingWriter.wrap(enc.frame(big)))
    writer.close()
    assert read_recording(path).records == [big] and read_recording(path).clean


def test_short_file_that_is_not_a_magic_prefix_is_not_a_recording(tmp_path):
    path = tmp_path / "short"
    path.write_bytes(b"PMx")
    with pytest.raises(RecordingError, match="not a perfmon recording"):
        read_recording(path)


def test_a_record_of_a_newer_kind_is_skipped_and_the_rest_read_on(tmp_path):
    """A recording made by a newer minor version reads to its end; its new kinds are counted."""
    path = tmp_path / "newer.pmrec"
    newer = {"k": "from_1_9", "t": 1.5}
    write(path, RECORDS[:1] + [newer] + RECORDS[1:] + [newer])
    result = read_recording(path)
    assert result.clean and result.records == RECORDS and result.skipped == 2


def test_a_write_the_kernel_takes_in_parts_is_written_whole(tmp_path, monkeypatch):
    """os.write may take fewer bytes than given (a signal, a full pipe or disk): the writer goes on
    from where it stopped, so the recording holds every byte once."""
    import os

    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, bytes(data[:7])))
    path = tmp_path / "parts.pmrec"
    write(path)
    monkeypatch.undo()
    result = read_recording(path)
    assert result.clean and result.records == RECORDS
