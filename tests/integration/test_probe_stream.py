"""The probe's live stream end to end: what a viewer sees, and what viewers cannot do to training."""

from __future__ import annotations

import os
import signal
import socket
import statistics
import struct
import subprocess
import sys
import time

import pytest

import probe
from probe import server, wire
from tests.integration.streamutil import connect, fd_count, raw_read_all, read_until, start_job, step_seen, wait_for


def steps_of(records):
    return [r for r in records if r["k"] == "step"]


def test_script_streams_hello_then_steps_matching_what_it_did():
    proc, path = start_job("timed", "40", "4", "2", "3", "--wait")
    sock = connect(path)
    proc.stdin.write("go\n")
    proc.stdin.flush()
    records = raw_read_all(sock)  # a client that knows only the documented frame format
    assert proc.wait(timeout=30) == 0
    assert records[0]["k"] == "hello" and records[0]["proto"] == list(wire.PROTO)
    assert records[0]["job"] == "timed" and records[0]["pid"] == proc.pid
    assert records[-1]["k"] == "bye"
    steps = steps_of(records)
    assert [s["step"] for s in steps] == list(range(40))
    later = steps[1:]  # step 0 has no previous step, so no data wait in it
    data = statistics.median(s["phases"]["data"] for s in later)
    fwd = statistics.median(s["phases"]["forward"] for s in later)
    bwd = statistics.median(s["phases"]["backward"] for s in later)
    assert 0.0039 <= data < 0.007, data
    assert 0.0019 <= fwd < 0.005 and 0.0029 <= bwd < 0.006
    for s in later:
        parts = sum(s["phases"].values()) + s["gap"]
        assert parts == pytest.approx(s["dur"], rel=1e-6)  # other = dur - known phases - gap
        assert s["samples"] == 8
    first_batch = [r for r in records if r["k"] == "event" and r["name"] == "first_batch"]
    assert len(first_batch) == 1 and first_batch[0]["seconds"] >= 0.0039


def test_late_viewer_gets_hello_and_backfill_of_recent_steps():
    proc, path = start_job("late", "30", "0", "0", "0", "--linger")
    # the job has trained all its steps and its sender has processed every one of them before we attach:
    # whatever steps this viewer gets come from the backfill, not from the live stream
    assert proc.stdout.readline().strip() == "drained"
    sock = connect(path)
    records = read_until(sock, lambda rs: len(steps_of(rs)) >= 30)
    assert records[0]["k"] == "hello"
    assert [s["step"] for s in steps_of(records)] == list(range(30))
    # backfill order: hello, recent events, the steps, then the latest sample/memory/comm
    kinds = [r["k"] for r in records]
    first, last = kinds.index("step"), len(kinds) - 1 - kinds[::-1].index("step")
    assert set(kinds[first:last + 1]) == {"step"}
    assert "first_batch" in [r.get("name") for r in records[:first] if r["k"] == "event"]
    proc.stdin.write("\n")
    proc.stdin.flush()
    assert proc.wait(timeout=30) == 0


def _emit(mon, n: int, phase: bool = True) -> float:
    t0 = time.perf_counter()
    for _ in mon.loader(range(n)):
        with mon.step(samples=1):
            if phase:
                with mon.phase("forward"):
                    pass
    return time.perf_counter() - t0


def missing_steps_announced(first: int, last: int):
    """A ``read_until`` condition: step ``last`` arrived, and drops records announced every step from
    ``first`` that did not. A viewer's losses are announced after the batch whose queueing caused them,
    so the last announcement may follow step ``last`` (seed 83814208 read up to ``last`` and stopped)."""
    scanned, got, dropped = 0, set(), 0

    def done(records: list[dict]) -> bool:
        nonlocal scanned, dropped
        for r in records[scanned:]:
            if r["k"] == "step" and r["step"] >= first:
                got.add(r["step"])
            elif r["k"] == "drops":
                dropped += r["count"]
        scanned = len(records)
        return last in got and (last - first + 1) - len(got) <= dropped

    return done


def test_stalled_viewer_does_not_slow_the_loop_and_its_losses_are_counted(monkeypatch):
    # this test is about drops, not eviction: a slow machine may take longer than the stall limit to
    # emit the steps that overflow the viewer's queue, so the limit is lifted out of its way
    monkeypatch.setattr(server, "STALL_SECONDS", 3600.0)
    mon = probe.start(job="stalled")
    try:
        n = 60_000
        alone = _emit(mon, n)
        wait_for(lambda: not mon._q, what="sender to drain")
        stalled = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.connect(str(mon.socket_path))
        wait_for(lambda: len(mon.sender.viewers) == 1, what="viewer accepted")
        first_step = mon._step_no
        with_stalled = _emit(mon, n)
        # the viewer never read, yet the loop ran at the same pace (generous bound for a busy machine)
        assert with_stalled < 3 * alone + 0.5, (alone, with_stalled)
        wait_for(lambda: not mon._q, what="sender to drain")
        (viewer,) = mon.sender.viewers.values()
        assert viewer.dropped_total > 0
        # now read: the newest steps arrive, and every missing one is accounted for by drops records
        last = first_step + n - 1
        records = read_until(stalled, missing_steps_announced(first_step, last))
        got = {r["step"] for r in steps_of(records) if r["step"] >= first_step}
        dropped = sum(r["count"] for r in records if r["k"] == "drops")
        assert dropped > 0
        assert n - len(got) <= dropped
        stalled.close()
    finally:
        mon.close()


def test_viewer_unwritable_past_the_stall_limit_is_disconnected(monkeypatch):
    monkeypatch.setattr(server, "STALL_SECONDS", 0.5)
    mon = probe.start(job="evict")
    try:
        stalled = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.connect(str(mon.socket_path))
        wait_for(lambda: len(mon.sender.viewers) == 1, what="viewer accepted")
        _emit(mon, 20_000)
        wait_for(lambda: len(mon.sender.viewers) == 0, timeout=10, what="stalled viewer eviction")
        # the evicted viewer sees the end of its stream (EOF) once it reads what reached its socket
        read_until(stalled, lambda rs: False, timeout=20)
        stalled.close()
        # the probe still serves: a new viewer is attached and gets the steps emitted after the eviction
        fresh = connect(mon.socket_path)
        wait_for(lambda: len(mon.sender.viewers) == 1, what="new viewer accepted")
        first_new = mon._step_no
        _emit(mon, 100)
        last_new = first_new + 99
        records = read_until(fresh, step_seen(last_new))
        assert records[0]["k"] == "hello"
        assert {r["step"] for r in steps_of(records)} >= set(range(first_new, last_new + 1))
        fresh.close()
    finally:
        mon.close()


KILLABLE_VIEWER = r"""
import socket, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
print("ready", flush=True)
while s.recv(100):
    pass
"""


def test_killing_a_viewer_mid_stream_leaves_training_running_and_no_leaked_fds():
    mon = probe.start(job="killed")
    try:
        _emit(mon, 10)
        wait_for(lambda: not mon._q, what="sender to drain")
        baseline_fds = fd_count()
        for _ in range(5):
            viewer = subprocess.Popen([sys.executable, "-c", KILLABLE_VIEWER, str(mon.socket_path)],
                                      stdout=subprocess.PIPE, text=True)
            assert viewer.stdout.readline().strip() == "ready"
            wait_for(lambda: len(mon.sender.viewers) == 1, what="viewer accepted")
            _emit(mon, 5000)  # stream is flowing while we kill
            viewer.send_signal(signal.SIGKILL)
            viewer.wait()
            viewer.stdout.close()
            _emit(mon, 5000)  # no exception reaches the loop
            wait_for(lambda: len(mon.sender.viewers) == 0, what="dead viewer closed")
        wait_for(lambda: fd_count() == baseline_fds, what="fd count back to baseline")
    finally:
        mon.close()


@pytest.mark.usefixtures("no_coverage_tracer")
def test_hundred_forks_while_sending_leave_children_silent_and_the_viewer_unaffected():
    mon = probe.start(job="forks")
    sock = connect(mon.socket_path)
    try:
        wait_for(lambda: len(mon.sender.viewers) == 1, what="viewer accepted")
        children = []
        for _ in range(100):
            _emit(mon, 50)
            pid = os.fork()
            if pid == 0:  # child: use the probe as a DataLoader worker might; it must stay silent
                code = 0
                try:
                    for _ in mon.loader(range(20)):
                        with mon.step():
                            pass
                    mon.event("from-child")
                    if mon.sender.listener.fileno() != -1 or mon.sender.viewers:
                        code = 3
                except BaseException:
                    code = 4
                os._exit(code)
            children.append(pid)
        codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children]
        assert codes == [0] * 100
        expected = mon._step_no
        records = read_until(sock, step_seen(expected - 1))
        steps = [r["step"] for r in steps_of(records)]
        assert steps == list(range(expected))            # no duplicates, no gaps: nothing from children
        assert not any(r["k"] == "event" and r.get("name") == "from-child" for r in records)
        assert mon.socket_path.exists()                  # children did not unlink the parent's socket
    finally:
        sock.close()
        mon.close()


def test_hostile_viewers_are_cut_off_and_a_good_viewer_is_unaffected():
    mon = probe.start(job="hostile")
    good = connect(mon.socket_path)
    try:
        bad = [connect(mon.socket_path) for _ in range(3)]
        bad[0].sendall(struct.pack(">I", 0xFFFFFFF0) + b"x" * 100)      # oversized length prefix
        bad[1].sendall(os.urandom(4096))                               # random bytes
        bad[2].sendall(wire.encode({"k": "hello", "t": 0.0, "proto": [1, 0], "x": [[[[[[[[[[1]]]]]]]]]]}))
        for b in bad:
            b.settimeout(5)
            while b.recv(1 << 16):  # probe closes them: EOF arrives
                pass
        _emit(mon, 100)
        records = read_until(good, lambda rs: len(steps_of(rs)) >= 100)
        assert [s["step"] for s in steps_of(records)] == list(range(100))
    finally:
        good.close()
        mon.close()


def test_ninth_viewer_gets_an_error_and_is_closed():
    mon = probe.start(job="crowd")
    viewers = [connect(mon.socket_path) for _ in range(server.MAX_VIEWERS)]
    try:
        wait_for(lambda: len(mon.sender.viewers) == server.MAX_VIEWERS, what="8 viewers accepted")
        extra = connect(mon.socket_path)
        records = read_until(extra, lambda rs: False)  # reads to EOF
        assert records[0]["k"] == "hello"
        assert records[-1]["k"] == "event" and "too many viewers" in records[-1]["message"]
    finally:
        for v in viewers:
            v.close()
        mon.close()


def test_viewer_with_another_major_version_is_refused_by_the_probe(capfd):
    mon = probe.start(job="versions")
    try:
        sock = connect(mon.socket_path)
        sock.sendall(wire.encode({"k": "hello", "t": 0.0, "proto": [2, 0]}))
        sock.settimeout(5)
        while sock.recv(1 << 16):
            pass
        expected = f"protocol version mismatch (viewer 2.0, probe {wire.format_proto(wire.PROTO)})"
        assert expected in capfd.readouterr().err
    finally:
        mon.close()


def test_hot_path_buffer_overflow_is_counted_as_a_drops_record(monkeypatch):
    from probe import core
    monkeypatch.setattr(core, "QUEUE_ITEMS", 64)
    mon = probe.start(job="overflow")
    sock = connect(mon.socket_path)
    try:
        wait_for(lambda: len(mon.sender.viewers) == 1, what="viewer accepted")
        _emit(mon, 20_000, phase=False)  # far faster than one 50 ms sender tick can drain 64 items
        last = mon._step_no - 1
        records = read_until(sock, step_seen(last))
        got = len(steps_of(records))
        lost = sum(r["count"] for r in records if r["k"] == "drops" and r["reason"].startswith("probe buffer full"))
        assert lost > 0 and got + lost == 20_000
    finally:
        sock.close()
        mon.close()


def test_a_1_1_kind_reaches_only_viewers_that_announced_1_1_and_a_viewer_arriving_during_a_stall_at_once():
    """Minor versions add kinds a 1.0 viewer would reject (wire 1.1): the probe sends ``stall`` only
    to viewers whose hello said minor >= 1, and gives the stall in course to one that arrives late."""
    mon = probe.start(job="minor")
    old, new = connect(mon.socket_path), connect(mon.socket_path)
    hello = {"k": "hello", "t": 0.0}
    try:
        old.sendall(wire.encode({**hello, "proto": [1, 0]}))
        new.sendall(wire.encode({**hello, "proto": [1, 1]}))
        wait_for(lambda: sorted(v.minor for v in mon.sender.viewers.values()) == [0, 1], what="both hellos read")
        mon.emit({"k": "stall", "t": time.time(), "seconds": 20.0, "step": 3, "where": "step", "stack": []})
        _emit(mon, 5)
        # a batch's 1.x frames follow its other frames: read until both the stall and the steps came
        got_new = read_until(new, lambda rs: len(steps_of(rs)) >= 5 and any(r["k"] == "stall" for r in rs))
        _emit(mon, 1)      # step 5, queued after the stall reached the new viewer: the old one's comes after it
        got_old = read_until(old, step_seen(5))
        assert [r["k"] for r in got_new].count("stall") == 1
        assert "stall" not in [r["k"] for r in got_old]
        late = connect(mon.socket_path)
        late.sendall(wire.encode({**hello, "proto": [1, 1]}))
        assert read_until(late, lambda rs: any(r["k"] == "stall" for r in rs))[-1]["seconds"] == 20.0
        mon.emit({"k": "resumed", "t": time.time(), "seconds": 21.0, "step": 4})
        read_until(new, lambda rs: any(r["k"] == "resumed" for r in rs))
        after = connect(mon.socket_path)
        after.sendall(wire.encode({**hello, "proto": [1, 1]}))
        _emit(mon, 1)
        assert "stall" not in [r["k"] for r in read_until(after, step_seen(6))]
        for sock in (late, after):
            sock.close()
    finally:
        old.close()
        new.close()
        mon.close()
