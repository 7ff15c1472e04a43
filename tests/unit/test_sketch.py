"""The quantile sketches (perfmon_analysis.sketch): the zero bucket, the wire form read back, and the
step-time sketch's exact longest step."""

from __future__ import annotations

import pytest

from perfmon_analysis.sketch import SKETCH_ACCURACY, SKETCH_MIN, DurationSketch, Sketch, is_count


def test_values_up_to_the_floor_count_as_zero_and_a_quantile_past_them_is_a_value():
    sketch = Sketch()
    for x in (SKETCH_MIN, 0.1, 0.1):
        sketch.add(x)
    assert sketch.zero == 1 and sum(sketch.bins.values()) == 2
    assert sketch.quantile(0.0) == 0.0
    assert sketch.quantile(0.5) == pytest.approx(0.1, rel=SKETCH_ACCURACY)    # the middle of three: not the zero
    two = Sketch()
    for x in (0.1, 0.2):
        two.add(x)
    assert two.quantile(0.0) == pytest.approx(0.1, rel=SKETCH_ACCURACY)
    assert two.quantile(1.0) == pytest.approx(0.2, rel=SKETCH_ACCURACY)
    assert Sketch().quantile(0.5) is None


def test_the_wire_form_reads_back_and_what_is_malformed_counts_as_nothing():
    sketch = Sketch()
    for x in (0.0, 0.01, 0.02, 0.02):
        sketch.add(x)
    again = Sketch.read(sketch.wire())
    assert (again.zero, again.bins) == (sketch.zero, sketch.bins)
    odd = Sketch.read({"z": True, "b": [1, 2, True, 3, 5, -1, 100_000, 1, -99_999, 1, 1, 3, 7, 0]})
    # a bool is no count nor index, a negative count and an index out of range are left out; a
    # repeated index adds up
    assert odd.zero == 0 and dict(odd.bins) == {1: 5, -99_999: 1, 7: 0}
    assert Sketch.read({"z": 4, "b": [1, 2, 3]}).bins == {} and Sketch.read({"z": 4, "b": [1, 2, 3]}).zero == 4
    assert Sketch.read([1, 2]).count == 0 and Sketch.read({"z": 2, "b": "ab"}).count == 2


def test_the_step_time_sketch_keeps_the_first_longest_step_and_never_reads_past_it():
    sketch = DurationSketch()
    assert sketch.quantile(0.5) is None and sketch.max_step is None
    sketch.add(0.0, 1)                        # a first step of no time is still the longest so far
    assert (sketch.max, sketch.max_step) == (0.0, 1)
    for step, seconds in ((2, 0.5), (3, 0.5), (4, 0.25)):
        sketch.add(seconds, step)
    assert (sketch.max, sketch.max_step) == (0.5, 2)
    assert sketch.quantile(1.0) == 0.5        # the bucket's middle would be over the longest step


def test_a_count_is_a_whole_number_of_things_zero_included():
    assert is_count(0) and is_count(3)
    assert not is_count(True) and not is_count(-1) and not is_count(1.0)
