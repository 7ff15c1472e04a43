"""`perfmon ls`, `record`, and their one-line errors, with torch out of reach."""

from __future__ import annotations

import json
import os
import socket
import struct
import threading
from pathlib import Path

import msgpack

from probe import paths, wire
from probe.recording import read_recording
from tests.helpers.cli import perfmon
from tests.integration.streamutil import start_job


def no_torch_env(tmp_path: Path) -> dict:
    """This environment, its PYTHONPATH led by a `torch` package that refuses to import."""
    fake = tmp_path / "notorch" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('torch is deliberately unimportable in this test')\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake.parent), os.environ.get("PYTHONPATH", "")])}


def test_ls_json_lists_the_job_with_a_usable_socket_and_torch_unimportable(tmp_path):
    env = no_torch_env(tmp_path)
    proc, path = start_job("lsjob", "5", "0", "0", "0", "--linger", env=env)
    try:
        out = perfmon("ls", "--json", env=env)
        assert out.returncode == 0, out.stderr
        entries = json.loads(out.stdout)
        (entry,) = [e for e in entries if e["job"] == "lsjob"]
        assert entry["rank"] == 0 and entry["pid"] == proc.pid and entry["socket"] == path
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(entry["socket"])
        (length,) = struct.unpack(">I", sock.recv(4, socket.MSG_WAITALL))
        hello = msgpack.unpackb(sock.recv(length, socket.MSG_WAITALL))
        assert hello["k"] == "hello" and hello["job"] == "lsjob"
        sock.close()
        text = perfmon("ls", env=env)
        assert "lsjob" in text.stdout and str(proc.pid) in text.stdout
    finally:
        proc.stdin.write("\n")
        proc.stdin.close()
        proc.wait(timeout=30)


def test_ls_removes_stale_sockets(perfmon_dir):
    stale = perfmon_dir / "ghost.r0.x0.p999999.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(stale))
    s.close()  # bound but nobody listens: connect is refused
    out = perfmon("ls", "--json")
    assert json.loads(out.stdout) == []
    assert not stale.exists()


def test_record_writes_a_readable_recording_until_the_job_says_bye(tmp_path):
    proc, path = start_job("recjob", "25", "1", "0", "0", "--wait")
    out_dir = tmp_path / "rec"
    recorder = None
    try:
        import subprocess
        import sys
        recorder = subprocess.Popen([sys.executable, "-m", "tui.cli", "record", "recjob", "-o", str(out_dir)],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert "recording 1 rank(s) of recjob" in recorder.stderr.readline()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.wait(timeout=30) == 0
        assert recorder.wait(timeout=30) == 0
        (file,) = list(out_dir.glob("*.pmrec"))
        result = read_recording(file)
        assert result.clean
        kinds = [r["k"] for r in result.records]
        assert kinds[0] == "hello" and kinds[-1] == "bye"
        assert [r["step"] for r in result.records if r["k"] == "step"] == list(range(25))
    finally:
        if recorder and recorder.poll() is None:
            recorder.kill()


def fake_probe(sock_path: Path, proto) -> threading.Thread:
    """A socket that speaks like a probe from another protocol major version."""
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(sock_path))
    srv.listen(1)

    def serve():
        conn, _ = srv.accept()
        body = msgpack.packb({"k": "hello", "t": 1.0, "proto": proto, "job": "future"})
        conn.sendall(struct.pack(">I", len(body)) + body)
        conn.recv(4096)
        conn.close()
        srv.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def test_protocol_major_mismatch_is_one_line_and_non_zero(perfmon_dir, tmp_path):
    sock_path = perfmon_dir / f"future.r0.x0.p{os.getpid()}{paths.SOCKET_SUFFIX}"
    fake_probe(sock_path, [2, 0])
    out = perfmon("record", str(sock_path), "-o", str(tmp_path / "out"))
    assert out.returncode != 0
    assert out.stderr.strip().splitlines()[-1] == \
        f"perfmon record: protocol version mismatch (viewer {wire.format_proto(wire.PROTO)}, probe 2.0)"
    assert "Traceback" not in out.stderr


def test_user_mistakes_are_one_line_errors(tmp_path):
    cases = [
        ("record", "nosuchjob", "-o", str(tmp_path / "x")),
        ("record", "999999", "-o", str(tmp_path / "x")),
    ]
    for args in cases:
        out = perfmon(*args)
        assert out.returncode == 2, args
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"perfmon {args[0]}: "), out.stderr


def test_report_reads_a_recording_with_torch_unimportable(tmp_path):
    env = no_torch_env(tmp_path)
    rec = tmp_path / "rec"
    proc, _ = start_job("reportjob", "30", "2", "1", "1", env={**env, "PERFMON_RECORD": str(rec)})
    assert proc.wait(timeout=60) == 0
    out = perfmon("report", str(rec), "--json", env=env)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["job"] == "reportjob" and report["metrics"]["steps"] == 30
    assert [r["rank"] for r in report["ranks"]] == [0]
    assert 0.3 < report["metrics"]["data_wait_frac"] < 0.8   # 2 ms wait in ~4 ms steps
    assert report["metrics"]["step_time_median_s"] > 0.003
