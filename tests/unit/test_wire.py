"""Wire protocol v1: framing, schema checks, version handshake, hostile input."""

from __future__ import annotations

import random
import resource
import struct

import msgpack
import pytest

from probe import wire

OURS = wire.format_proto(wire.PROTO)


def frame_of(obj) -> bytes:
    body = msgpack.packb(obj, use_bin_type=True)
    return struct.pack(">I", len(body)) + body


def decode_all(data: bytes, chunk: int | None = None) -> list[dict]:
    dec = wire.FrameDecoder()
    out: list[dict] = []
    step = chunk or len(data) or 1
    for i in range(0, len(data), step):
        out.extend(dec.feed(data[i:i + step]))
    return out


def test_round_trip_across_arbitrary_chunk_boundaries():
    enc = wire.Encoder()
    records = [{"k": "hello", "t": 1.0, "proto": [1, 0], "job": "j"}] + [
        {"k": "step", "t": 2.0 + i, "step": i, "dur": 0.01, "phases": {"data": 0.004}} for i in range(300)]
    stream = b"".join(enc.frame(r) for r in records)
    for chunk in (1, 7, 777, len(stream)):
        assert decode_all(stream, chunk) == records


def test_frame_is_u32_big_endian_length_then_msgpack_map():
    data = wire.encode({"k": "bye", "t": 5.0})
    (length,) = struct.unpack(">I", data[:4])
    assert length == len(data) - 4
    assert msgpack.unpackb(data[4:]) == {"k": "bye", "t": 5.0}


def test_oversized_length_prefix_is_rejected_before_any_body_is_buffered():
    dec = wire.FrameDecoder()
    with pytest.raises(wire.ProtocolError, match="over the 1048576-byte limit"):
        list(dec.feed(struct.pack(">I", 0xFFFFFFFF)))
    assert dec.pending == 4  # nothing beyond the header was kept


def test_encoder_refuses_records_over_the_frame_limit():
    with pytest.raises(wire.ProtocolError, match="over the 1 MiB frame limit"):
        wire.Encoder().frame({"k": "event", "t": 0.0, "name": "x", "blob": b"\0" * (wire.MAX_FRAME + 1)})


@pytest.mark.parametrize("body, why", [
    (b"\xdd\xff\xff\xff\xff", "array32 bomb"),
    (b"\xdf\xff\xff\xff\xff", "map32 bomb"),
    (b"\xc6\xff\xff\xff\xff", "bin32 bomb"),
    (b"\xc1", "reserved byte"),
    (b"\x91" * 1025 + b"\xc0", "1025 nested arrays"),
    (msgpack.packb({1: 2}), "non-string key"),
    (msgpack.packb([1, 2, 3]), "not a map"),
    (msgpack.packb({"k": "step", "t": 1.0}), "step without its keys"),
    (msgpack.packb({"k": 7, "t": 1.0}), "kind not a string"),
    (msgpack.packb({"k": "nope"}), "unknown kind without a time"),
    (msgpack.packb({"k": "bye"}), "no time"),
    (msgpack.packb({"k": "bye", "t": 1.0, "x": {"a": {"b": {"c": {"d": {"e": {"f": {"g": {"h": 1}}}}}}}}}), "deep map"),
    (msgpack.packb({"k": "bye", "t": 1.0}) + b"\x00", "trailing bytes"),
])
def test_hostile_bodies_raise_protocol_error_only(body, why):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(wire.ProtocolError):
        decode_all(struct.pack(">I", len(body)) + body)
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 64 * 1024, f"{why}: decoder grew RSS by {grown_kib} KiB"


def test_a_newer_minor_versions_kind_is_skipped_and_counted_not_fatal():
    """1.1 readers skip well-formed records of kinds they do not know (minor versions
    add kinds); the records around them still arrive."""
    stream = frame_of({"k": "bye", "t": 1.0}) + frame_of({"k": "from_1_9", "t": 2.0, "x": 1}) + \
        frame_of({"k": "bye", "t": 3.0})
    dec = wire.FrameDecoder()
    assert [r["t"] for r in dec.feed(stream)] == [1.0, 3.0]
    assert dec.skipped == 1
    assert list(dec.feed(frame_of({"k": "from_1_9", "t": 4.0}))) == [] and dec.skipped == 2
    with pytest.raises(wire.UnknownKind, match="^unknown record kind 'from_1_9'$"):
        wire.decode_body(msgpack.packb({"k": "from_1_9", "t": 2.0}))


def test_every_kind_names_the_minor_version_that_introduced_it():
    assert wire.KINDS == set(wire.KIND_MINOR)
    assert max(wire.KIND_MINOR.values()) <= wire.PROTO[1]     # a minor version adds kinds or only keys
    assert {k for k, m in wire.KIND_MINOR.items() if m == 0} == {
        "hello", "step", "sample", "memory", "comm", "event", "drops", "bye"}


def test_random_bytes_never_raise_anything_but_protocol_error():
    rng = random.Random(1234)
    for _ in range(3000):
        blob = bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 64)))
        framed = struct.pack(">I", len(blob)) + blob
        try:
            decode_all(framed)
        except wire.ProtocolError:
            pass
        try:  # unframed garbage: the prefix itself is random
            decode_all(blob)
        except wire.ProtocolError:
            pass


def test_unknown_keys_are_kept_for_forward_compatibility():
    rec = {"k": "step", "t": 1.0, "step": 3, "dur": 0.1, "added_in_1_1": {"x": 1}}
    assert decode_all(frame_of(rec)) == [rec]


def test_wrong_type_for_a_known_key_is_rejected():
    with pytest.raises(wire.ProtocolError, match="'phases' of the wrong type"):
        decode_all(frame_of({"k": "step", "t": 1.0, "step": 1, "dur": 0.1, "phases": [1, 2]}))


def test_major_mismatch_names_both_sides_from_each_point_of_view():
    with pytest.raises(wire.ProtocolMismatch, match=rf"^protocol version mismatch \(viewer {OURS}, probe 2.0\)$"):
        wire.check_compatible([2, 0], we_are="viewer")
    with pytest.raises(wire.ProtocolMismatch, match=rf"^protocol version mismatch \(viewer 3.1, probe {OURS}\)$"):
        wire.check_compatible([3, 1], we_are="probe")


def test_newer_minor_version_is_compatible():
    wire.check_compatible([1, 7], we_are="viewer")
    wire.check_compatible([1, 0], we_are="probe")


def test_unreadable_version_is_a_mismatch_shown_as_question_mark():
    for garbage in (None, [], ["x", 0], {"a": 1}, [None, 0]):
        with pytest.raises(wire.ProtocolMismatch, match=rf"^protocol version mismatch \(viewer {OURS}, probe \?\)$"):
            wire.check_compatible(garbage, we_are="viewer")
    assert wire.format_proto([1]) == "?" and wire.format_proto(None) == "?"


def test_frame_of_exactly_the_limit_is_accepted_one_byte_more_is_not():
    body = msgpack.packb({"k": "bye", "t": 1.0}, use_bin_type=True)
    exact = wire.FrameDecoder(max_frame=len(body))
    assert list(exact.feed(frame_of({"k": "bye", "t": 1.0}))) == [{"k": "bye", "t": 1.0}]
    short = wire.FrameDecoder(max_frame=len(body) - 1)
    with pytest.raises(wire.ProtocolError, match=f"claims {len(body)} bytes, over the {len(body) - 1}-byte limit"):
        list(short.feed(frame_of({"k": "bye", "t": 1.0})))


def test_error_names_the_stream_offset_of_the_bad_frame():
    good = frame_of({"k": "bye", "t": 1.0}) + frame_of({"k": "step", "t": 2.0, "step": 1, "dur": 0.5})
    dec = wire.FrameDecoder(max_frame=64)
    with pytest.raises(wire.ProtocolError, match=f"^frame at offset {len(good)} claims 65 bytes"):
        list(dec.feed(good + struct.pack(">I", 65)))
    assert dec.offset == len(good)


@pytest.mark.parametrize("record,why", [
    ({"k": "event", "t": 1.0, "x": {"a": {"b": {"c": {"d": {"e": {"f": {"g": {}}}}}}}}}, "nested deeper than 8 levels"),
    ({"k": "event", "t": 1.0, "x": [[[[[[[[1]]]]]]]]}, "nested deeper than 8 levels"),
    ({"k": "event", "t": 1.0, "x": {str(i): i for i in range(10_001)}}, "^record has an oversized map$"),
    ({"k": "event", "t": 1.0, "x": [{"y": list(range(10_001))}]}, "^record has an oversized list$"),
    ({"k": "event", "t": 1.0, "x": [{"y": {1: 2}}]}, "^record has a non-string key$"),
])
def test_shape_limits_apply_at_every_depth(record, why):
    body = msgpack.packb(record, use_bin_type=True, strict_types=False)
    with pytest.raises(wire.ProtocolError, match=why):
        wire.validate(msgpack.unpackb(body, strict_map_key=False))


def test_shapes_just_inside_the_limits_are_accepted():
    ok = {"k": "event", "t": 1.0, "name": "n", "x": {"a": {"b": {"c": {"d": {"e": {"f": {"g": 1}}}}}}},
          "y": list(range(10_000)), "z": [[1, {"w": []}]], "m": {str(i): i for i in range(10_000)},
          "l": [[[[[[[1]]]]]]]}
    assert wire.validate(ok) is ok


def test_bytes_and_strings_keep_their_types_and_lists_stay_lists():
    rec = {"k": "event", "t": 1.0, "name": "n", "blob": b"\x00\xff", "text": "é", "xs": [1, [2]]}
    assert decode_all(wire.encode(rec)) == [rec]
    assert isinstance(decode_all(wire.encode(rec))[0]["blob"], bytes)


def test_each_rejection_says_what_was_wrong():
    cases = [
        (msgpack.packb([1]), "^frame is not a map$"),
        (msgpack.packb({1: 2}), r"^undecodable frame \(ValueError\)$"),
        (b"\xc1", r"^undecodable frame \(FormatError\)$"),
        (msgpack.packb({"k": "x" * 40, "t": 1.0}), "^unknown record kind 'xxxxxxxxxxxxxxxxxxxx'$"),
        (msgpack.packb({"k": [1] * 10, "t": 1.0}), r"^unknown record kind '\[1, 1, 1, 1, 1, 1, 1'$"),
        (msgpack.packb({"k": "bye"}), "^bye record without a time$"),
        (msgpack.packb({"k": "bye", "t": True}), "^bye record without a time$"),
        (msgpack.packb({"k": "step", "t": 1.0, "step": "3", "dur": 0.1}),
         "^step record: 'step' missing or of the wrong type$"),
    ]
    for body, message in cases:
        with pytest.raises(wire.ProtocolError, match=message):
            wire.decode_body(body)


def test_a_record_nested_eight_deep_counting_the_record_itself_is_accepted():
    rec = {"k": "event", "t": 1.0, "name": "n", "x": {"a": {"b": {"c": {"d": {"e": {"f": 1}}}}}}}
    assert wire.decode_body(msgpack.packb(rec)) == rec
    rec["x"]["a"]["b"]["c"]["d"]["e"]["f"] = {"g": [1]}
    with pytest.raises(wire.ProtocolError, match="nested deeper than 8 levels"):
        wire.decode_body(msgpack.packb(rec))


def test_encoder_limit_is_inclusive_and_names_the_kind():
    enc = wire.Encoder()
    base = len(msgpack.packb({"k": "event", "t": 0.0, "name": "x", "blob": b""}, use_bin_type=True))
    # a blob this long has a 5-byte bin32 header instead of the 2-byte bin8 one: the body is exactly MAX_FRAME
    blob = b"\0" * (wire.MAX_FRAME - base - 3)
    body_len = len(msgpack.packb({"k": "event", "t": 0.0, "name": "x", "blob": blob}, use_bin_type=True))
    assert body_len == wire.MAX_FRAME
    assert len(enc.frame({"k": "event", "t": 0.0, "name": "x", "blob": blob})) == wire.MAX_FRAME + 4
    with pytest.raises(wire.ProtocolError, match=r"^record of kind 'event' is 1048577 bytes, over the 1 MiB"):
        enc.frame({"k": "event", "t": 0.0, "name": "x", "blob": blob + b"\0"})


def test_a_boolean_is_accepted_only_where_the_schema_names_bool():
    ok = {"k": "stall", "t": 1.0, "seconds": 2.0, "moving": True}
    assert wire.decode_body(msgpack.packb(ok)) == ok
    with pytest.raises(wire.ProtocolError, match="^stall record: 'step' of the wrong type$"):
        wire.decode_body(msgpack.packb({"k": "stall", "t": 1.0, "seconds": 2.0, "step": True}))
    with pytest.raises(wire.ProtocolError, match="^stall record: 'seconds' missing or of the wrong type$"):
        wire.decode_body(msgpack.packb({"k": "stall", "t": 1.0, "seconds": True}))
