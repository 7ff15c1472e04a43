"""Viewer→probe requests through a real probe's socket (probe.requests, probe.server,
probe.module_profile, tui.stream.requests): who may ask, how often, and a profile of an
in-process model from request to result, with every hook gone after it."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import torch
import torch.nn as nn

import probe
from probe import requests, wire
from tests.integration.streamutil import read_until
from tui.errors import UserError
from tui.stream.requests import Target, ask


@pytest.fixture
def mon():
    p = probe.start(job="req", serve=True)
    yield p
    p.close()


def _viewer(mon, minor: int) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(mon.socket_path))
    sock.sendall(wire.encode({"k": "hello", "t": time.time(), "proto": [1, minor], "role": "viewer"}))
    return sock


def _request(sock: socket.socket, rid: int, op: str = "profile", **params) -> None:
    sock.sendall(wire.encode({"k": "request", "t": time.time(), "id": rid, "op": op, **params}))


def _answers(records: list[dict]) -> list[dict]:
    return [r for r in records if r["k"] == "answer"]


def test_a_request_is_answered_with_the_reason_it_is_refused(mon):
    sock = _viewer(mon, 1)
    _request(sock, 11, "profile")
    _request(sock, 12, "reboot")
    got = _answers(read_until(sock, lambda rs: len(_answers(rs)) == 2))
    assert [(a["id"], a["ok"]) for a in got] == [(11, False), (12, False)]
    assert got[0]["reason"].startswith("no model to profile")
    assert got[1]["reason"] == "unknown request 'reboot' (this probe answers: profile, capture, detach)"


def test_a_viewer_that_did_not_announce_1_1_gets_no_answer(mon):
    old = _viewer(mon, 0)
    _request(old, 1)
    new = _viewer(mon, 1)           # the probe handles viewers in order: its answer comes after old's would
    _request(new, 2)
    read_until(new, lambda rs: bool(_answers(rs)))
    old.setblocking(False)          # whatever the probe sent old before new's answer is in its socket now
    seen = b""
    try:
        while chunk := old.recv(1 << 16):
            seen += chunk
    except BlockingIOError:
        pass
    assert all(r["k"] != "answer" for r in wire.FrameDecoder().feed(seen))


def test_requests_beyond_the_rate_are_refused_without_reaching_the_probe(mon, monkeypatch):
    handled = []
    monkeypatch.setattr(mon.sender, "on_request", lambda rec: handled.append(rec["id"]) or "no")
    sock = _viewer(mon, 1)
    for rid in range(requests.RATE + 2):
        _request(sock, rid)
    got = _answers(read_until(sock, lambda rs: len(_answers(rs)) == requests.RATE + 2))
    assert handled == list(range(requests.RATE))
    assert [a["reason"] for a in got[requests.RATE:]] == [f"too many requests (at most {requests.RATE} in 10 s)"] * 2


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Sequential(nn.Linear(16, 16), nn.ReLU())
        self.b = nn.Linear(16, 4)

    def forward(self, x):
        return self.b(self.a(x))


def _train(mon, model, opt, stop: threading.Event) -> None:
    x = torch.randn(8, 16)
    while not stop.is_set():
        with mon.step(samples=8):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()


def _hooks(model) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def test_a_profile_times_each_module_for_n_steps_and_removes_every_hook(mon):
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon.watch(model, opt)
    before = _hooks(model)
    stop = threading.Event()
    trainer = threading.Thread(target=_train, args=(mon, model, opt, stop))
    trainer.start()
    try:
        result = ask(Target(path=str(mon.socket_path)), "profile", {"steps": 4, "depth": 2}, 30, "profile")
        hooks_after = _hooks(model)
        end_hooks = len(mon._end_hooks)
    finally:
        stop.set()
        trainer.join()
    rows = {m["name"]: m for m in result["modules"]}
    assert set(rows) == {"", "a", "a.0", "a.1", "b"}
    assert result["steps"] == 4 and result["last_step"] - result["first_step"] == 3
    assert rows["a.0"]["flops"] == 2 * (2 * 8 * 16 * 16)     # forward, grad weight: its input needs no grad
    assert rows["b"]["flops"] == 3 * (2 * 8 * 16 * 4)        # forward, grad input, grad weight
    assert rows["b"]["fwd_flops"] == 2 * 8 * 16 * 4
    assert rows[""]["flops"] == rows["a"]["flops"] + rows["b"]["flops"]
    assert all(m["fwd_s"] > 0 and m["bwd_s"] > 0 and m["calls"] == 1.0 for m in result["modules"])
    assert rows[""]["fwd_s"] >= rows["a"]["fwd_s"] + rows["b"]["fwd_s"]
    assert hooks_after == before and end_hooks == 1                 # the watcher's own hooks only
    assert result["cost"]["thread_cpu_s"] > 0                       # its own thread's CPU, in its result


def test_the_client_says_when_the_request_is_refused_or_the_probe_too_old(mon, tmp_path):
    mon.sender.on_request = lambda rec: "steps must be 1..50"
    with pytest.raises(UserError, match=r"^x: profile refused: steps must be 1\.\.50$"):
        ask(Target(path=str(mon.socket_path), label="x"), "profile", {"steps": 99}, 10, "profile")
    old = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)       # a probe of protocol 1.0
    old.bind(str(tmp_path / "old.sock"))
    old.listen(1)

    def serve() -> None:
        conn, _ = old.accept()
        conn.sendall(wire.encode({"k": "hello", "t": time.time(), "proto": [1, 0], "rank": 0}))
        conn.recv(4096)
        conn.close()

    threading.Thread(target=serve, daemon=True).start()
    with pytest.raises(UserError, match="^y: the job's perfmon speaks protocol 1.0, which takes no requests"):
        ask(Target(path=str(tmp_path / "old.sock"), label="y"), "profile", {}, 10, "profile")
    old.close()


class ItemInForward(nn.Module):
    """Calls ``.item()`` in its forward: a meta-device copy cannot run it."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 4)

    def forward(self, x):
        scale = 1.0 if x.abs().max().item() > 0 else 0.5
        return self.lin(x) * scale


def test_a_model_the_meta_copy_cannot_run_is_counted_live_in_one_extra_step(mon):
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    model = ItemInForward()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon.watch(model, opt)
    modes_after = []
    stop = threading.Event()

    def train() -> None:
        _train(mon, model, opt, stop)
        modes_after.append(_get_current_dispatch_mode())

    trainer = threading.Thread(target=train)
    trainer.start()
    try:
        result = ask(Target(path=str(mon.socket_path)), "profile", {"steps": 3, "depth": 1}, 30, "profile")
    finally:
        stop.set()
        trainer.join()
    rows = {m["name"]: m for m in result["modules"]}
    assert result["flops_note"].startswith("counted live in step ")
    assert "meta-device replay failed" in result["flops_note"]
    assert rows["lin"]["flops"] == 2 * (2 * 8 * 16 * 4)     # forward and grad weight: x needs no gradient
    assert modes_after == [None]                            # no dispatch mode left on the training thread


def test_a_compiled_model_is_refused_before_any_hook_goes_on(mon):
    model = Tiny()
    compiled = torch.compile(model)        # nothing is compiled until it is called
    mon.watch(compiled, torch.optim.SGD(model.parameters(), lr=0.01))
    before = _hooks(model)
    reason = mon.handle_request({"k": "request", "t": 0.0, "id": 3, "op": "profile", "steps": 2, "depth": 1})
    assert reason.startswith("the model is compiled (torch.compile): hooks on its modules would make dynamo recompile")
    assert _hooks(model) == before and mon.attached.profiler.state == "idle"


def test_a_second_capture_while_ours_runs_names_ours_not_the_jobs_profiler(mon):
    """While a capture runs, torch.profiler is running: ours. A second request is refused naming
    that capture, not blaming a profiler of the job's own."""
    assert requests.handle(mon, {"op": "capture", "id": 1, "steps": 3}) is None
    with mon.step():                      # the window starts when the step the request came in ends
        pass
    assert mon.attached.capture.state == "running"
    reason = requests.handle(mon, {"op": "capture", "id": 2, "steps": 2})
    assert reason.startswith("a capture is already running (request 1, "), reason
    for _ in range(3):
        with mon.step():
            pass
