"""The ``exception`` event names the user's line an exception came from, not the library frame."""

from __future__ import annotations

import json
import sys

from probe.exceptions import exception_event


def _parse_bad_config() -> None:
    json.loads("{not json")          # raises inside the standard library


def test_the_event_names_the_users_line_below_the_library_frame_and_the_step():
    try:
        _parse_bad_config()
    except ValueError:
        et, ev, tb = sys.exc_info()
    fields = exception_event(et, ev, tb, step=41)
    assert fields["name"] == "exception" and fields["error"] == "JSONDecodeError" and fields["step"] == 41
    assert fields["file"] == __file__ and fields["function"] == "_parse_bad_config"
    assert fields["call"] == 'json.loads("{not json")          # raises inside the standard library'
    assert fields["line"] == _parse_bad_config.__code__.co_firstlineno + 1


def test_an_out_of_memory_error_is_an_oom_event_and_no_traceback_is_no_site():
    fields = exception_event(MemoryError, MemoryError("no room"), None, step=3)
    assert fields["name"] == "oom" and "file" not in fields and fields["message"] == "no room"
