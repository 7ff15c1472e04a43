"""Asking a probe for something (their form: ``probe/wire.py``): one request, its answer, its result.

``ask(target, ...)`` works on any target: a ``Target`` (a rank's Unix socket, or host:port with
its token) opens one connection of its own with blocking sockets and deadlines, so the TUI's
stream is untouched; a relay's target (``tui.stream.remote``) sends the request through the relay
that serves the rank's node. Either way the result record also reaches every attached viewer and
the recording, so the TUI's model learns it through its stream. Used by ``perfmon profile``,
``perfmon capture``, the relay itself and the TUI's screens (on a worker thread).
"""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Callable
from typing import Any, Protocol

from probe import wire
from tui.errors import UserError
from tui.stream.sources import viewer_hello


def new_id() -> int:
    return random.randrange(1, 1 << 31)


class Askable(Protocol):
    """What a request can be sent to: a ``Target`` here, or a rank behind a relay
    (``tui.stream.remote.RelayTarget``)."""

    label: str

    def ask(self, op: str, params: dict[str, Any], timeout: float, result_kind: str | None = None,
            on_record: Callable[[dict[str, Any]], None] | None = None,
            request_id: int | None = None) -> dict[str, Any]: ...


class Target:
    """Where a probe listens: a Unix socket path, or host:port with its token."""

    def __init__(self, path: str | None = None, host: str | None = None, port: int | None = None,
                 token: str | None = None, label: str = "") -> None:
        self.path, self.host, self.port, self.token = path, host, port, token
        self.label = label or path or f"{host}:{port}"

    def connect(self, timeout: float) -> socket.socket:
        try:
            if self.path is not None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(timeout)
                sock.connect(self.path)
            elif self.port is not None:
                sock = socket.create_connection((self.host, self.port), timeout=timeout)
            else:
                raise UserError(f"{self.label}: neither a socket path nor a port")
        except OSError as exc:
            raise UserError(f"cannot reach {self.label}: {exc.strerror or exc}") from None
        return sock


    def ask(self, op: str, params: dict[str, Any], timeout: float, result_kind: str | None = None,
            on_record: Callable[[dict[str, Any]], None] | None = None, request_id: int | None = None) -> dict[str, Any]:
        return _ask_socket(self, op, params, timeout, result_kind, on_record, request_id or new_id())


def ask(target: Askable, op: str, params: dict[str, Any], timeout: float, result_kind: str | None = None,
        on_record: Callable[[dict[str, Any]], None] | None = None, request_id: int | None = None) -> dict[str, Any]:
    """Send one request; return the probe's result record (``result_kind`` with the request's
    id), or the accepting answer when there is none to wait for. A refusal, an old probe or the
    deadline passing raise ``UserError`` with one line. ``on_record`` sees every record of the
    connection (the backfill and live steps: what a caller needs to judge the result against)."""
    return target.ask(op, params, timeout, result_kind, on_record, request_id)


def _ask_socket(target: Target, op: str, params: dict[str, Any], timeout: float, result_kind: str | None,
                on_record: Callable[[dict[str, Any]], None] | None, request_id: int) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    sock = target.connect(min(timeout, 5.0))
    decoder = wire.FrameDecoder()
    try:
        sock.sendall(viewer_hello(target.token))
        seen = on_record or (lambda record: None)
        hello = _next(sock, decoder, deadline, target, lambda r: r["k"] == "hello", "its hello", seen)
        if not _speaks(hello.get("proto"), "request"):
            raise UserError(f"{target.label}: the job's perfmon speaks protocol "
                            f"{wire.format_proto(hello.get('proto'))}, "
                            "which takes no requests; run the job with this perfmon version")
        sock.sendall(wire.encode({"k": "request", "t": time.time(), "id": request_id, "op": op, **params}))
        answer = _next(sock, decoder, deadline, target,
                       lambda r: r["k"] == "answer" and r.get("id") == request_id, "an answer", seen)
        if not answer.get("ok"):
            raise UserError(f"{target.label}: {op} refused: {answer.get('reason') or 'no reason given'}")
        if result_kind is None:
            return answer
        return _next(sock, decoder, deadline, target,
                     lambda r: r["k"] == result_kind and r.get("id") == request_id, f"the {op} result", seen)
    finally:
        sock.close()


def _speaks(proto: Any, kind: str) -> bool:
    try:
        return int(proto[0]) == wire.PROTO[0] and int(proto[1]) >= wire.KIND_MINOR[kind]
    except (TypeError, ValueError, IndexError, KeyError):
        return False


def _next(sock: socket.socket, decoder: wire.FrameDecoder, deadline: float, target: Target,
          wanted: Callable[[dict[str, Any]], bool], what: str,
          seen: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    data = b""                 # frames already buffered by the decoder come first
    while True:
        try:
            for record in decoder.feed(data):
                if record["k"] == "hello":
                    wire.check_compatible(record.get("proto"), we_are="viewer")
                if record["k"] == "bye":
                    raise UserError(f"{target.label}: the job ended before {what} came")
                seen(record)
                if wanted(record):
                    return record
        except wire.ProtocolError as exc:
            raise UserError(f"{target.label}: {exc}") from None
        left = deadline - time.monotonic()
        if left <= 0:
            raise UserError(f"{target.label}: no {what} within the time allowed"
                            + (" (is the job still stepping?)" if "result" in what else ""))
        sock.settimeout(left)
        try:
            data = sock.recv(1 << 16)
        except TimeoutError:
            data = b""
            continue
        except OSError as exc:
            raise UserError(f"{target.label}: connection lost: {exc.strerror or exc}") from None
        if not data:
            raise UserError(f"{target.label}: the job closed the connection before {what} came")
