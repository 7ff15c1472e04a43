"""A job across nodes: two torchrun "nodes" on this machine (c10d rendezvous on
localhost, one socket directory each), reached through an ssh stand-in that runs
``perfmon relay --stdio`` with that node's directory; one view of the 4 ranks."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from probe import wire
from probe.wire import PROTO, format_proto
from tests.helpers.net import free_port
from tests.integration.streamutil import kill_tree

pytestmark = pytest.mark.slow

SCRIPTS = Path(__file__).parent / "scripts"
BIN = str(Path(sys.executable).parent)          # `perfmon` as a remote shell would find it


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """4 ranks on 2 "nodes" (n01: ranks 0-1, n02: ranks 2-3); rank 3 computes 3x longer."""
    base = tmp_path_factory.mktemp("nodes")
    port, master = free_port(), free_port()
    launchers = []
    for node in (0, 1):
        sock_dir = base / f"n0{node + 1}"
        sock_dir.mkdir(mode=0o700)
        env = {**os.environ, "PERFMON_DIR": str(sock_dir), "PERFMON_JOB": "mn"}
        launchers.append(subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
             "--node-rank", str(node), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
             "--rdzv-id", "mn", "--master-port", str(master), str(SCRIPTS / "multinode_job.py"),
             "--steps", "3000", "--slow-rank", "3"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True))
    deadline = time.monotonic() + 120
    while sum(len(list((base / n).glob("*.sock"))) for n in ("n01", "n02")) < 4:
        assert all(p.poll() is None for p in launchers), [p.stderr.read()[-2000:] for p in launchers]
        assert time.monotonic() < deadline, "the ranks did not start"
        time.sleep(0.2)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
           "PERFMON_VIA": f"{sys.executable} {SCRIPTS / 'via_standin.py'} {base} {{host}}"}
    env.pop("PERFMON_DIR", None)
    env["PERFMON_TEST_NODES"] = str(base)      # for the tests that start a relay by hand
    yield env
    for p in launchers:
        kill_tree(p)


def _report(env: dict, hosts: str, seconds: float = 4.0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tui.cli", "report", "mn", "--hosts", hosts, "--json",
                           "--seconds", str(seconds)], capture_output=True, text=True, timeout=90, env=env)


def test_one_report_of_four_ranks_on_two_nodes_names_the_straggler_and_its_node(two_nodes):
    deadline = time.monotonic() + 60
    while True:     # the window fills in a few seconds
        out = _report(two_nodes, "n[01-02]")
        assert out.returncode == 0, out.stderr
        rep = json.loads(out.stdout)
        if rep["verdict"]["bottleneck"] not in ("warming_up",) or time.monotonic() > deadline:
            break
    assert {r["rank"]: r["host"] for r in rep["ranks"]} == {0: "n01", 1: "n01", 2: "n02", 3: "n02"}
    v = rep["verdict"]
    assert (v["bottleneck"], v["straggler_rank"]) == ("load_imbalance", 3), v["headline"]
    assert v["headline"].startswith("Load imbalance: rank 3 on n02 computes")
    assert rep["source"]["hosts"] == ["n01", "n02"]


def test_unreachable_jobless_and_other_version_hosts_are_one_line_each_and_the_rest_report(two_nodes):
    # the 3 seconds count from the moment every host's relay has answered or failed, however long ssh took
    out = _report(two_nodes, "n01,down,n03,old", seconds=3)
    assert out.returncode == 0, out.stderr
    lines = out.stderr.strip().splitlines()
    assert "perfmon report: down: ssh: connect to host down port 22: Connection refused" in lines
    assert any(line.startswith("perfmon report: n03: perfmon relay: no job named 'mn'") for line in lines), lines
    assert f"perfmon report: old: protocol version mismatch (viewer {format_proto(PROTO)}, relay 2.0)" in lines
    assert "Traceback" not in out.stderr
    rep = json.loads(out.stdout)
    assert sorted(r["rank"] for r in rep["ranks"]) == [0, 1] and len(rep["problems"]) == 3


def test_no_host_answering_is_one_line_and_an_error(two_nodes):
    out = _report(two_nodes, "down", seconds=2)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].startswith("perfmon report: ")
    assert "Connection refused" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed")
def test_attach_across_hosts_in_a_terminal_shows_the_four_ranks_by_node(two_nodes, tmp_path):
    from tests.e2e.test_tmux import Tmux
    tmux = Tmux(tmp_path / "tmux.sock")
    env = " ".join(f"{k}={shlex.quote(two_nodes[k])}" for k in ("PATH", "PERFMON_VIA"))
    try:
        # the shell writes the exit status to a file: tmux 3.3 sometimes leaves a dead pane's process
        # unreaped, and then never reports #{pane_dead_status} (as in tests/e2e/test_tmux.py)
        status_file = tmp_path / "status"
        tmux.start(f"env {env} TERM=xterm-256color {sys.executable} -m tui.cli attach mn --hosts n01,n02,down"
                   f"; echo $? > {status_file}", 120, 36)
        deadline = time.monotonic() + 60
        while "rank 3 on n02" not in (screen := tmux.screen()).lower():   # the verdict bar capitalises
            assert time.monotonic() < deadline, screen
            time.sleep(0.3)
        assert "4/4 ranks" in screen and "1 host(s) failed: down" in screen
        rows = re.findall(r"┃ (\d) +(n0\d) ", screen)    # the ranks pane: one row per rank with its node
        assert rows == [("0", "n01"), ("1", "n01"), ("2", "n02"), ("3", "n02")], screen
        tmux.run("send-keys", "-t", "t", "q")
        deadline = time.monotonic() + 10
        while not status_file.exists() or not status_file.read_text().strip():
            assert time.monotonic() < deadline, "q did not end the viewer"
            time.sleep(0.1)
        assert status_file.read_text().strip() == "0"
    finally:
        tmux.kill()


def test_record_across_hosts_keeps_a_directory_per_node_and_the_report_names_the_nodes(two_nodes, tmp_path):
    out = subprocess.run([sys.executable, "-m", "tui.cli", "record", "mn", "--hosts", "n01,n02", "-o",
                          str(tmp_path / "rec"), "--seconds", "3"], capture_output=True, text=True, timeout=90,
                         env=two_nodes)
    assert out.returncode == 0, out.stderr
    files = sorted((tmp_path / "rec").rglob("*.pmrec"))
    assert [p.parent.name for p in files] == ["n01", "n01", "n02", "n02"]
    from probe.recording import read_recording
    for path in files:      # a recording follows every rank in full: steps, never summaries
        kinds = [r["k"] for r in read_recording(path).records]
        assert kinds.count("step") > 10 and "summary" not in kinds, path
    rep = subprocess.run([sys.executable, "-m", "tui.cli", "report", str(tmp_path / "rec"), "--json"],
                         capture_output=True, text=True, timeout=60)
    assert rep.returncode == 0, rep.stderr
    assert {r["rank"]: r["host"] for r in json.loads(rep.stdout)["ranks"]} == {0: "n01", 1: "n01", 2: "n02",
                                                                             3: "n02"}


async def test_a_profile_of_a_rank_on_another_node_goes_through_its_relay(two_nodes, monkeypatch):
    """The TUI's ``m`` on a rank of n02: the request and its answer pass through n02's relay, the
    profile comes back with the rank's stream; a bad rank name is refused by the relay."""
    import asyncio

    from perfmon_analysis.analysis import Analysis
    from tui.errors import UserError
    from tui.stream.remote import RelayFeed
    from tui.stream.requests import ask

    monkeypatch.setenv("PATH", two_nodes["PATH"])
    feed = RelayFeed(Analysis(), "mn", ["n01", "n02"], two_nodes["PERFMON_VIA"])
    task = asyncio.ensure_future(feed.run())
    try:
        deadline = time.monotonic() + 60
        while not any(r.rank == 3 and r.steps for r in feed.analysis.view().ranks):
            assert time.monotonic() < deadline, "rank 3 did not come through its relay"
            await asyncio.sleep(0.2)
        stream = next(r.stream for r in feed.analysis.view().ranks if r.rank == 3)
        target = feed.request_target(stream)
        result = await asyncio.to_thread(ask, target, "profile", {"steps": 3, "depth": 1}, 90, "profile")
        bogus = feed.request_target(stream.replace(".r3.", ".r9."))
        with pytest.raises(UserError) as refused:
            await asyncio.to_thread(ask, bogus, "profile", {"steps": 3}, 30, "profile")
        view = feed.analysis.view()            # the record came with the rank's stream, into the model first
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await feed.aclose()
    assert result["steps"] == 3 and [m["type"] for m in result["modules"]] == ["Linear"]
    assert view.profile is not None and view.profile.rank == 3
    assert "profile refused: cannot reach rank 9" in str(refused.value)


class RelayPipe:
    """``perfmon relay --stdio mn`` on node n01, spoken to as a viewer would."""

    def __init__(self, env: dict) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "tui.cli", "relay", "--stdio", "mn"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env={**env, "PERFMON_DIR": str(Path(env["PERFMON_TEST_NODES"]) / "n01")})
        self.decoder = wire.FrameDecoder()

    def send(self, record: dict) -> None:
        self.proc.stdin.write(wire.encode({"t": time.time(), **record}))
        self.proc.stdin.flush()

    def read_until(self, done, timeout: float = 30.0) -> list[dict]:
        """Records until ``done(records so far)`` holds."""
        import select
        got: list[dict] = []
        deadline = time.monotonic() + timeout
        while not done(got):
            assert time.monotonic() < deadline, [(r["k"], r.get("src")) for r in got[-20:]]
            if select.select([self.proc.stdout], [], [], 0.5)[0]:
                data = os.read(self.proc.stdout.fileno(), 1 << 16)
                assert data, self.proc.stderr.read().decode()
                got.extend(self.decoder.feed(data))
        return got

    def close(self) -> int:
        """The viewer goes away: its stdin closes, and it reads on until the relay ends (a relay
        writing to a viewer that has stopped reading blocks in that write and cannot see the EOF)."""
        try:
            self.proc.communicate(timeout=10)
            return self.proc.returncode
        finally:
            kill_tree(self.proc)


def _kinds(records: list[dict], kind: str) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in records:
        if r["k"] == kind:
            out.setdefault(r["src"], []).append(r)
    return out


def test_a_relay_summarises_each_rank_and_sends_the_steps_of_the_subscribed_one(two_nodes):
    relay = RelayPipe(two_nodes)
    try:
        relay.send({"k": "hello", "proto": list(PROTO)})
        def timed(recs: list[dict]) -> list[dict]:
            """Summaries with a window: a rank still warming up is summarised on every flush."""
            return [r for r in recs if not r["stats"].get("warming_up", True)]

        got = relay.read_until(lambda rs: len(_kinds(rs, "summary")) == 2 and all(
            len(timed(v)) >= 3 for v in _kinds(rs, "summary").values()))
        assert got[0]["k"] == "hello" and got[0]["role"] == "relay"
        assert not _kinds(got, "step"), "steps of a rank nobody subscribed to"
        summaries = {src: timed(recs) for src, recs in _kinds(got, "summary").items()}
        src0 = next(src for src, recs in summaries.items() if ".r0." in src)
        for recs in summaries.values():     # at most 2 Hz per rank once it has a window, each with its step count
            span = recs[-1]["t"] - recs[0]["t"]
            assert len(recs) <= 2 * span + 2 and recs[-1]["steps"] > recs[0]["steps"] > 0
        last_summary_steps = summaries[src0][-1]["steps"]

        relay.send({"k": "subscribe", "srcs": [src0], "window": [50, 30.0]})
        got = relay.read_until(lambda rs: any(r["k"] == "step" and r["step"] > last_summary_steps + 20
                                              for r in rs))
        steps = _kinds(got, "step")
        assert list(steps) == [src0]            # only the subscribed rank's steps
        numbers = [r["step"] for r in steps[src0]]
        # its buffered steps first (the relay's backfill): all of them, or the last thousand and more
        assert numbers[0] <= last_summary_steps - min(last_summary_steps, 1000)
        assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)
        assert src0 not in _kinds(got, "summary") or all(
            r["t"] <= steps[src0][0]["t"] + 1 for r in _kinds(got, "summary")[src0])   # no summary once followed
        assert relay.close() == 0               # stdin closed: the viewer went away
    finally:
        kill_tree(relay.proc)


def test_a_relay_sends_everything_to_a_viewer_that_says_no_hello(two_nodes):
    """A perfmon 1.1 viewer never writes on the relay's stdin: it gets every record of every rank."""
    relay = RelayPipe(two_nodes)
    try:
        got = relay.read_until(lambda rs: len(_kinds(rs, "step")) == 2)
        assert not _kinds(got, "summary")
        assert relay.close() == 0
    finally:
        kill_tree(relay.proc)


async def test_a_view_through_relays_has_every_rank_summarised_and_the_followed_rank_in_full(two_nodes, monkeypatch):
    """What the TUI does: all four ranks with their numbers from the relays' summaries, and the
    step records (the timeline) only of the rank it follows; following another rank moves them."""
    import asyncio

    from perfmon_analysis.analysis import Analysis
    from tui.stream.remote import RelayFeed

    monkeypatch.setenv("PATH", two_nodes["PATH"])
    feed = RelayFeed(Analysis(), "mn", ["n01", "n02"], two_nodes["PERFMON_VIA"])
    task = asyncio.ensure_future(feed.run())

    async def until(cond, what: str) -> None:
        deadline = time.monotonic() + 60
        while not cond(feed.analysis.view()):
            assert time.monotonic() < deadline, what
            await asyncio.sleep(0.2)

    try:
        # a rank is summarised as soon as it has a step time; the straggler is decided once comm is measured
        await until(lambda v: len(v.ranks) == 4 and all(r.step_time_median_s for r in v.ranks)
                    and v.straggler_rank is not None, "4 summarised ranks and a straggler")
        view = feed.analysis.view()
        assert all(not t.steps for t in view.traces.values())          # summaries only: no step records
        assert view.straggler_rank == 3 and {r.host for r in view.ranks} == {"n01", "n02"}
        stream3 = next(r.stream for r in view.ranks if r.rank == 3)
        feed.follow({stream3})
        await until(lambda v: len(v.traces[3].steps) > 50, "rank 3's steps after following it")
        assert not feed.analysis.view().traces[0].steps
        feed.follow({next(r.stream for r in view.ranks if r.rank == 0)})
        await until(lambda v: v.traces[0].steps and not v.traces[3].steps, "rank 0 followed, rank 3 summarised")
        view = feed.analysis.view()
        assert view.straggler_rank == 3 and view.ranks[3].steps > 0 and view.ranks[3].ettr is not None
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await feed.aclose()


def test_a_relay_listening_on_tcp_serves_one_viewer_with_the_token_and_refuses_a_wrong_one(two_nodes):
    """``perfmon relay --tcp`` on n01 (a cluster where the viewer cannot start commands on the
    nodes): a viewer with the wrong token is refused in one line on each side, the right one gets
    n01's ranks; the relay ends when that viewer goes away."""
    import select

    env = {**two_nodes, "PERFMON_DIR": str(Path(two_nodes["PERFMON_TEST_NODES"]) / "n01"), "PERFMON_TOKEN": "s3cret"}
    relay = subprocess.Popen([sys.executable, "-m", "tui.cli", "relay", "--tcp", "127.0.0.1:0", "mn"],
                             stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert select.select([relay.stderr], [], [], 30)[0], "the relay did not start listening"
        line = relay.stderr.readline()
        found = re.search(r"on 127\.0\.0\.1:(\d+), token from PERFMON_TOKEN", line)
        assert found, line + relay.stderr.read()
        port = int(found[1])
        viewer = {**two_nodes, "PERFMON_TOKEN": "wrong"}
        cmd = [sys.executable, "-m", "tui.cli", "report", "mn", "--hosts", "127.0.0.1", "--relay-port", str(port),
               "--json", "--seconds", "3"]
        refused = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=viewer)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr
        assert (f"perfmon report: 127.0.0.1: its relay on port {port} closed the connection: wrong token, "
                "or not a perfmon relay") in refused.stderr.splitlines()
        assert relay.stderr.readline().strip() == "perfmon relay: refused a viewer from 127.0.0.1: wrong token"
        out = subprocess.run(cmd[:-1] + ["6"], capture_output=True, text=True, timeout=60,
                             env={**two_nodes, "PERFMON_TOKEN": "s3cret"})
        assert out.returncode == 0, out.stderr
        rep = json.loads(out.stdout)
        assert {r["rank"]: r["host"] for r in rep["ranks"]} == {0: "127.0.0.1", 1: "127.0.0.1"}
        assert all(r["steps"] > 0 for r in rep["ranks"])
        assert relay.wait(10) == 0          # its viewer went away
    finally:
        kill_tree(relay)


def test_relay_port_without_a_token_is_one_line(two_nodes):
    env = {k: v for k, v in two_nodes.items() if k != "PERFMON_TOKEN"}
    out = subprocess.run([sys.executable, "-m", "tui.cli", "report", "mn", "--hosts", "n01", "--relay-port", "7700"],
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 2
    assert out.stderr.strip() == ("perfmon report: --relay-port needs the relays' token: --token TOKEN or "
                                  "PERFMON_TOKEN (set the same PERFMON_TOKEN for 'perfmon relay --tcp' on every host)")


def test_profile_and_capture_of_ranks_on_other_nodes_from_the_command_line(two_nodes):
    """``perfmon profile --hosts ... --rank 3`` and ``perfmon capture --hosts ... --ranks 0,3``: each
    rank asked through its node's relay, the results printed here as for a local job."""
    prof = subprocess.run([sys.executable, "-m", "tui.cli", "profile", "mn", "--hosts", "n01,n02", "--rank", "3",
                           "--steps", "3", "--depth", "1", "--json", "--timeout", "90"],
                          capture_output=True, text=True, timeout=150, env=two_nodes)
    assert prof.returncode == 0, prof.stderr
    data = json.loads(prof.stdout)
    assert data["rank"] == 3 and data["steps"] == 3 and [m["type"] for m in data["modules"]][-1] == "Linear"
    assert "profiling rank 3 on n02" in prof.stderr
    cap = subprocess.run([sys.executable, "-m", "tui.cli", "capture", "mn", "--hosts", "n01,n02", "--ranks", "0,3",
                          "--steps", "2", "--json", "--timeout", "90"],
                         capture_output=True, text=True, timeout=150, env=two_nodes)
    assert cap.returncode == 0, cap.stderr
    caps = json.loads(cap.stdout)
    assert sorted(c["rank"] for c in caps["captures"]) == [0, 3] and caps["errors"] == []
    missing = subprocess.run([sys.executable, "-m", "tui.cli", "profile", "mn", "--hosts", "n01,n02", "--rank", "9",
                              "--timeout", "5"], capture_output=True, text=True, timeout=60, env=two_nodes)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert missing.stderr.strip().splitlines()[-1] == "perfmon profile: job mn has no rank 9 on those hosts"
