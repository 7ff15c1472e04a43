"""A headless Chromium driven over the DevTools protocol on a pipe (no extra package, no port).

``load(path)`` opens a local HTML file, waits for the load event and for ``ready`` (a JavaScript
expression) to be true, and returns what the page did: console errors and uncaught exceptions,
every request for a URL outside the file itself, and the value of ``probe`` (a JavaScript
expression) evaluated at the end.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def executable() -> str | None:
    """Debian's ``chromium`` (``.ci/run`` installs it), else Chrome where present."""
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


@dataclass
class PageRun:
    errors: list[str] = field(default_factory=list)      # console errors, uncaught exceptions, failed loads
    requests: list[str] = field(default_factory=list)    # URLs requested other than the file itself
    result: Any = None                                   # ``probe``'s value
    ready: bool = False


def _as_fds_3_4(read_end: int, write_end: int) -> None:
    """In the child: the pipe ends as fd 3 and 4 (copied first, so neither overwrites the other)."""
    a, b = os.dup(read_end), os.dup(write_end)
    os.dup2(a, 3)
    os.dup2(b, 4)


class _Pipe:
    """Chromium's ``--remote-debugging-pipe``: it reads commands on fd 3, answers on fd 4, NUL-separated."""

    def __init__(self, binary: str, profile: str) -> None:
        to_browser_r, self._out = os.pipe()
        self._in, from_browser_w = os.pipe()
        self.proc = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe", "--no-first-run",
             "--disable-background-networking", "--disable-extensions", f"--user-data-dir={profile}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            close_fds=False,     # the ends are made inheritable as fd 3 and 4 only; the rest close on exec
            preexec_fn=lambda: _as_fds_3_4(to_browser_r, from_browser_w))
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict[str, Any]] = []
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._in, selectors.EVENT_READ)

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
             timeout: float = 30.0) -> dict[str, Any]:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._out, json.dumps(msg).encode() + b"\0")
        want = self._id
        deadline = time.monotonic() + timeout
        answer: dict[str, Any] | None = None
        while answer is None:
            for m in self._read(deadline):     # the answer may share a read with events after it: keep them
                if m.get("id") == want:
                    answer = m
                else:
                    self.events.append(m)
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error']}")
        return answer.get("result", {})

    def pump(self, seconds: float) -> None:
        """Collect events for up to ``seconds``."""
        self.events.extend(self._read(time.monotonic() + seconds, wait_all=True))

    def _read(self, deadline: float, wait_all: bool = False) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                if wait_all:
                    return out
                raise TimeoutError("no answer from chromium")
            if not self._sel.select(left):
                continue
            chunk = os.read(self._in, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed its DevTools pipe")
            self._buf += chunk
            *whole, self._buf = self._buf.split(b"\0")
            out.extend(json.loads(w) for w in whole if w)
            if out and not wait_all:
                return out

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=5)
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._out)
        os.close(self._in)


def load(path: Path, ready: str, probe: str, prepare: str = "", timeout: float = 180.0) -> PageRun:
    """Open ``path`` headless; wait for ``ready`` to be true (``timeout`` only bounds a failure: a
    loaded machine draws a large page slowly); evaluate ``prepare`` (when given), let the page
    redraw, and evaluate ``probe``."""
    binary = executable()
    assert binary is not None, "chromium is not installed (apt-get install chromium)"
    url = path.resolve().as_uri()
    run = PageRun()
    with tempfile.TemporaryDirectory(prefix="perfmon-chromium-") as profile:
        pipe = _Pipe(binary, profile)
        try:
            target = pipe.send("Target.createTarget", {"url": "about:blank"})["targetId"]
            session = pipe.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Runtime", "Log", "Network", "Page"):
                pipe.send(f"{domain}.enable", session=session)
            pipe.send("Page.navigate", {"url": url}, session=session)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                value = pipe.send("Runtime.evaluate", {"expression": f"Boolean({ready})", "returnByValue": True},
                                  session=session)
                if value.get("result", {}).get("value") is True:
                    run.ready = True
                    break
                pipe.pump(0.2)
            if prepare:
                pipe.send("Runtime.evaluate", {"expression": prepare}, session=session)
            pipe.pump(0.5)     # the redraw, and anything it logs
            value = pipe.send("Runtime.evaluate", {"expression": probe, "returnByValue": True}, session=session)
            run.result = value.get("result", {}).get("value")
        finally:
            pipe.close()
    for event in pipe.events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            run.errors.append("console: " + " ".join(str(a.get("value", a.get("description")))
                                                     for a in params.get("args", [])))
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            described = details.get("exception", {}).get("description")
            run.errors.append("exception: " + str(described or details.get("text")))
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            run.errors.append("log: " + str(params["entry"].get("text")) + " " + str(params["entry"].get("url", "")))
        elif method == "Network.requestWillBeSent":
            req = params.get("request", {}).get("url", "")
            if req != url and not req.startswith(("data:", "blob:", "about:")):
                run.requests.append(req)
        elif method == "Network.loadingFailed":
            run.errors.append("load failed: " + str(params.get("errorText")))
    return run
