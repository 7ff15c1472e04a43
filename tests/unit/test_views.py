"""The view types (perfmon_analysis.views): what their properties derive and what their JSON says."""

from __future__ import annotations

import pytest

from perfmon_analysis.views import HolderLine, MemoryMetrics, WhereLine, WhereTable


def _line(line: int, state: str | None, share: float, span: str = "step", **fields) -> WhereLine:
    return WhereLine(**{"file": "/home/u/train.py", "line": line, "function": "main", "call": None, "lib": None,
                        "state": state, "samples": 10, "share": share, "err": 0.01, "span": span, **fields})


def _holder(thread: str, span: str) -> HolderLine:
    return HolderLine(thread=thread, file="C:\\u\\tok.py", line=7, function="run", call="x = f()", span=span,
                      samples=4, share=0.123456, of_waiting=0.654321)


def test_a_line_is_named_by_its_files_base_name_and_says_the_call_it_makes():
    windows = _line(21, "waiting", 0.4, file="C:\\Users\\u\\train.py", call="time.sleep(1)")
    assert windows.site == "train.py:21" and _line(3, None, 0.1).site == "train.py:3"
    assert windows.what == "time.sleep(1)"                                    # its text, without a library call
    assert _line(3, None, 0.1, lib="torch.mm", call="y = x @ w").what == "torch.mm"
    assert _line(3, None, 0.1).what == "main"                                 # nothing else known: the function


def test_a_lines_json_rounds_its_share_and_error_to_four_places():
    assert _line(21, "busy", 0.123456, call="f()", lib="m.f", err=0.0123456, span="between").as_json() == {
        "file": "/home/u/train.py", "line": 21, "function": "main", "call": "f()", "lib": "m.f", "state": "busy",
        "share": 0.1235, "err": 0.0123, "samples": 10, "span": "between"}


def test_a_gil_holders_json_and_site():
    holder = _holder("tokenizer", "step")
    assert holder.site == "tok.py:7"
    assert holder.as_json() == {"thread": "tokenizer", "file": "C:\\u\\tok.py", "line": 7, "function": "run",
                                "call": "x = f()", "span": "step", "samples": 4, "share": 0.1235,
                                "of_waiting": 0.6543}


def test_the_where_tables_shares_come_from_its_sample_counts():
    table = WhereTable(rank=0, samples=100, hz=20.0, span_share=0.8, waiting=30, busy=10, lines=(), runq=0.25,
                       between_samples=20, between_share=0.2, between_waiting=5, between_busy=15,
                       between_busy_before=6)
    assert table.contention == pytest.approx(0.2)             # runnable a quarter of the in-step 80%
    assert table.wait_frac == 0.75 and table.between_wait_frac == 0.25 and table.between_prep_frac == 0.4
    empty = WhereTable(rank=0, samples=0, hz=None, span_share=0.0, waiting=0, busy=0, lines=())
    assert (empty.contention, empty.wait_frac, empty.between_wait_frac, empty.between_prep_frac) == \
        (None, None, None, None)


def test_the_top_lines_are_filtered_by_state_and_span_in_their_order_and_the_holder_by_span():
    lines = (_line(1, "busy", 0.5), _line(2, "waiting", 0.3), _line(3, "waiting", 0.2, span="between"),
             _line(4, "busy", 0.1), _line(5, "waiting", 0.05))
    holders = (_holder("a", "between"), _holder("b", "step"))
    table = WhereTable(rank=0, samples=100, hz=20.0, span_share=1.0, waiting=1, busy=1, lines=lines, holders=holders)
    assert [x.line for x in table.top()] == [1, 2, 4, 5]
    assert [x.line for x in table.top(2)] == [1, 2]
    assert [x.line for x in table.top(state="waiting")] == [2, 5]
    assert [x.line for x in table.top(span="between")] == [3]
    assert [x.line for x in table.top(10, state="waiting", span=None)] == [2, 3, 5]
    many = WhereTable(rank=0, samples=100, hz=20.0, span_share=1.0, waiting=1, busy=1,
                      lines=tuple(_line(n, "busy", 0.1) for n in range(7)))
    assert [x.line for x in many.top()] == [0, 1, 2, 3, 4]            # five by default
    assert table.holder().thread == "a" and table.holder("step").thread == "b"
    assert table.holder("other") is None


def test_the_memory_json_has_every_key_the_report_schema_names():
    memory = MemoryMetrics(source="device", rank=1, limit_bytes=80, limit_source="device", peak_bytes=60,
                           peak_frac=0.75, params_bytes=1, grads_bytes=2, optimizer_bytes=3, activations_bytes=4,
                           cache_bytes=5, other_bytes=6, fragmentation_bytes=7, reserved_bytes=8, allocated_bytes=9,
                           alloc_retries=2, alloc_retries_rising=True, ooms=1)
    assert memory.as_json() == {
        "limit_bytes": 80, "peak_bytes": 60, "params_bytes": 1, "grads_bytes": 2, "optimizer_bytes": 3,
        "activations_bytes": 4, "cache_bytes": 5, "other_bytes": 6, "fragmentation_bytes": 7, "reserved_bytes": 8,
        "peak_frac": 0.75, "source": "device", "limit_source": "device", "rank": 1, "alloc_retries": 2,
        "alloc_retries_rising": True, "ooms": 1}
