"""The DevTools pipe the browser tests read (tests/helpers/chromium.py): an answer and the events
after it can arrive in one read, and none of those events may be lost (a console error among them
is what the HTML report's browser check looks for)."""

from __future__ import annotations

import json
import os
import selectors

from tests.helpers.chromium import _Pipe


def _pipe_fed(*messages: dict) -> tuple[_Pipe, int]:
    """A ``_Pipe`` with no browser behind it: ``messages`` wait in one write on its input; the end
    its commands go to, for the caller to close."""
    pipe = object.__new__(_Pipe)
    pipe._in, browser_out = os.pipe()
    browser_in, pipe._out = os.pipe()
    pipe._buf, pipe._id, pipe.events = b"", 0, []
    pipe._sel = selectors.DefaultSelector()
    pipe._sel.register(pipe._in, selectors.EVENT_READ)
    os.write(browser_out, b"".join(json.dumps(m).encode() + b"\0" for m in messages))
    os.close(browser_out)
    return pipe, browser_in


def test_events_read_together_with_an_answer_are_all_kept():
    before = {"method": "Page.frameNavigated", "params": {}}
    after = {"method": "Runtime.consoleAPICalled", "params": {"type": "error", "args": [{"value": "planted"}]}}
    pipe, commands = _pipe_fed(before, {"id": 1, "result": {"ok": True}}, after)
    try:
        assert pipe.send("Runtime.evaluate", timeout=5) == {"ok": True}
        assert pipe.events == [before, after]
    finally:
        for fd in (pipe._in, pipe._out, commands):
            os.close(fd)
