"""``perfmon demo``: launch the built-in workload's ranks, watch them, and stop them cleanly.

Each rank is ``python -m tui.commands.demo.workload`` in its own session (process group), so
Ctrl-C in the terminal reaches only this launcher, which then stops every rank:
SIGTERM to each group, SIGKILL after a grace period, and removal of any socket a
killed rank left behind. With ``--headless`` the launcher follows the ranks' live
streams into a ``RunModel`` for ``--seconds`` once they are all up, and prints the
report JSON (docs/report.md); otherwise it opens the TUI on the job until ``q``.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probe import paths
from probe.host import parse_bytes
from tui.commands.demo import scenarios
from tui.errors import UserError
from tui.stream import discovery

HEADLESS_SECONDS = 40.0
STARTUP_TIMEOUT = 120.0     # importing torch and joining the process group on a loaded machine
STOP_GRACE = 5.0            # SIGTERM -> SIGKILL
MAX_RANKS = 8
LOG_TAIL_LINES = 15


@dataclass
class Ranks:
    """The launched rank processes of one demo job."""

    job: str
    procs: list[subprocess.Popen]
    log_path: Path
    scratch: Path
    nodes: int = 1
    stopped: bool = False

    def failed(self) -> list[tuple[int, int]]:
        """(rank, exit code) of ranks that exited on their own with an error."""
        return [(r, p.returncode) for r, p in enumerate(self.procs)
                if p.returncode not in (None, 0) and not (self.stopped and p.returncode < 0)]

    def stop(self) -> list[int]:
        """Stop every rank and its loader workers; return the ranks that had to be killed."""
        self.stopped = True
        for p in self.procs:
            _signal_group(p, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE
        killed = []
        for rank, p in enumerate(self.procs):
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(p, signal.SIGKILL)
                p.wait()
                killed.append(rank)
        for p in self.procs:
            _signal_group(p, signal.SIGKILL)   # loader workers a rank left behind share its group
        self._remove_sockets()
        return killed

    def _remove_sockets(self) -> None:
        pids = {p.pid for p in self.procs}
        directory = paths.socket_dir()
        try:
            entries = list(directory.iterdir())
        except OSError:
            return
        for entry in entries:
            name = paths.parse_name(entry.name)
            if name is not None and name.pid in pids and entry.name.endswith(paths.SOCKET_SUFFIX):
                try:
                    entry.unlink()
                except OSError:
                    pass

    def log_tail(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-LOG_TAIL_LINES:])


def _signal_group(p: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(p.pid, sig)   # start_new_session: the group id is the rank's pid
    except (ProcessLookupError, PermissionError):
        pass


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _job_name(scenario: str) -> str:
    """``demo-<scenario>``, made unique if another demo of that name runs here."""
    base = paths.safe_job(f"demo-{scenario}")
    try:
        taken = discovery.jobs(discovery.list_endpoints())
    except UserError:
        taken = {}
    return base if base not in taken else paths.safe_job(f"{base}-{os.getpid()}")


def _has_cuda() -> bool:
    import torch  # only here: the launcher asks once, for the GPU-only scenario
    return bool(torch.cuda.is_available())


def launch(scenario: str, ranks: int, *, job: str, seconds: float | None, memory_limit: str | None,
           record: str | None, nodes: int = 1) -> Ranks:
    """Start the ranks (own sessions, output to one log file) and return at once. With ``nodes`` > 1
    the ranks are split into that many "nodes" on this machine, each its own socket directory."""
    scratch = Path(tempfile.mkdtemp(prefix="perfmon-demo-"))
    log_path = scratch / "demo.log"
    port = _free_port()
    t0 = time.time()
    procs: list[subprocess.Popen] = []
    per_node = -(-ranks // nodes)
    with open(log_path, "ab") as log:
        for rank in range(ranks):
            env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank % per_node), WORLD_SIZE=str(ranks),
                       LOCAL_WORLD_SIZE=str(per_node), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                       PYTHONUNBUFFERED="1")
            if nodes > 1:
                node_dir = node_dirs(scratch, nodes)[rank // per_node]
                node_dir.mkdir(mode=0o700, exist_ok=True)
                env["PERFMON_DIR"] = str(node_dir)
            env.pop("PERFMON_JOB", None)
            stall_s = scenarios.SCENARIOS[scenario].stall_s if scenario in scenarios.SCENARIOS else None
            if stall_s is not None:
                env.setdefault("PERFMON_STALL_S", str(stall_s))
            if record:
                env["PERFMON_RECORD"] = record
            cmd = [sys.executable, "-m", "tui.commands.demo.workload", "--scenario", scenario, "--job", job,
                   "--t0", repr(t0), "--parent-pid", str(os.getpid())]
            if seconds is not None:
                cmd += ["--seconds", repr(seconds)]
            if memory_limit:
                cmd += ["--memory-limit", memory_limit]
            procs.append(subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True))
    return Ranks(job, procs, log_path, scratch, nodes)


def node_dirs(scratch: Path, nodes: int) -> list[Path]:
    """The socket directory of each "node" of ``perfmon demo --nodes N``: ``<scratch>/node1`` ..."""
    return [scratch / f"node{k + 1}" for k in range(nodes)]


def relay_feed(ranks: Ranks, analysis: Any) -> Any:
    """The multi-node view of a ``--nodes`` demo: a relay per node, started through a local transport
    (``env PERFMON_DIR=<node dir>``) instead of ssh, exactly as ``attach --hosts`` starts them."""
    from tui.stream.remote import RelayFeed
    via = f"env PERFMON_DIR={shlex.quote(str(ranks.scratch))}/{{host}}"
    return RelayFeed(analysis, ranks.job, [d.name for d in node_dirs(ranks.scratch, ranks.nodes)], via,
                     relay=(sys.executable, "-m", "tui.cli", "relay", "--stdio"))


def wait_for_ranks(ranks: Ranks, count: int, timeout: float = STARTUP_TIMEOUT) -> list[discovery.Endpoint]:
    """Poll the socket directory until every rank's probe listens; fail if a rank dies first."""
    deadline = time.monotonic() + timeout
    dirs = node_dirs(ranks.scratch, ranks.nodes) if ranks.nodes > 1 else [None]
    while True:
        found = [ep for d in dirs if d is None or d.exists()
                 for ep in discovery.jobs(discovery.list_endpoints(d)).get(ranks.job, [])]
        pids = {p.pid for p in ranks.procs}
        mine = [ep for ep in found if ep.pid in pids]
        if len(mine) >= count:
            return mine
        for p in ranks.procs:
            p.poll()
        if ranks.failed() or any(p.returncode is not None for p in ranks.procs):
            raise DemoFailed(ranks)
        if time.monotonic() > deadline:
            raise DemoFailed(ranks, f"the ranks did not start within {timeout:.0f} s")
        time.sleep(0.2)


class DemoFailed(Exception):
    """A rank failed or never came up: carries the log tail for the user."""

    def __init__(self, ranks: Ranks, why: str | None = None) -> None:
        failed = ranks.failed()
        if why is None:
            why = ", ".join(f"rank {r} exited with code {c}" for r, c in failed) or "a rank exited early"
        super().__init__(why)
        self.ranks = ranks


def headless(ranks: Ranks, count: int, seconds: float, source: dict[str, Any]) -> dict:
    """Follow the live ranks for ``seconds`` and build the report from what they sent."""
    from perfmon_analysis.analysis import Analysis
    from tui.stream.feed import LiveFeed, follow
    from tui.stream.sources import StreamError

    endpoints = wait_for_ranks(ranks, count)
    analysis = Analysis()
    feed = relay_feed(ranks, analysis) if ranks.nodes > 1 else LiveFeed(analysis, endpoints[0].job, endpoints,
                                                                         rescan=False)
    try:
        follow(feed, seconds)
    except StreamError as exc:
        raise DemoFailed(ranks, str(exc)) from None
    for p in ranks.procs:
        p.poll()
    if ranks.failed():
        raise DemoFailed(ranks)
    return analysis.report(time.time(), source=source)


def _raise_exit(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def main(args: Any) -> int:
    """``perfmon demo [--scenario NAME] [--ranks N] [--seconds S] [--headless]``."""
    name = args.scenario or scenarios.TOUR_NAME
    if name not in scenarios.names():
        raise UserError(f"unknown scenario {name!r}; choose one of: {', '.join(scenarios.names())}")
    default_ranks = 1 if name == scenarios.TOUR_NAME else scenarios.SCENARIOS[name].ranks
    nodes = getattr(args, "nodes", 1) or 1
    count = args.ranks if args.ranks is not None else max(default_ranks, nodes)
    if not 1 <= nodes <= count:
        raise UserError(f"--nodes must be between 1 and the number of ranks ({count})")
    if not 1 <= count <= MAX_RANKS:
        raise UserError(f"--ranks must be between 1 and {MAX_RANKS}")
    if count < default_ranks:
        raise UserError(f"scenario {name} needs at least {default_ranks} ranks")
    chosen = scenarios.tour(count) if name == scenarios.TOUR_NAME else (scenarios.SCENARIOS[name],)
    if args.seconds is not None and args.seconds <= 0:
        raise UserError("--seconds must be positive")
    if args.memory_limit is not None and parse_bytes(args.memory_limit) is None:
        raise UserError(f"--memory-limit {args.memory_limit!r}: expected a size such as 2G or 700M")
    if any(s.needs_gpu for s in chosen) and not _has_cuda():
        raise UserError(f"scenario {name} needs a GPU (host-device syncs do not exist on CPU) and none is visible")
    if not args.headless and not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UserError("needs a terminal for the TUI; use --headless to print the report instead")

    job = _job_name(name)
    watch: float = args.seconds if args.seconds is not None else HEADLESS_SECONDS     # --headless only
    previous = {sig: signal.signal(sig, _raise_exit) for sig in (signal.SIGTERM, signal.SIGHUP)}
    ranks = launch(name, count, job=job, seconds=None if args.headless else args.seconds,
                   memory_limit=args.memory_limit, record=args.record, nodes=nodes)
    failure: DemoFailed | None = None
    rc = 0
    try:
        if args.headless:
            what = chosen[0].summary if len(chosen) == 1 else f"a tour of {len(chosen)} scenarios"
            print(f"perfmon demo: {name} ({count} rank{'s' * (count > 1)}): {what}; watching for {watch:g} s "
                  "once the ranks are up", file=sys.stderr, flush=True)
            source = {"kind": "demo", "scenario": name, "ranks": count, "seconds": watch, "nodes": nodes}
            report = headless(ranks, count, watch, source)
        else:
            from perfmon_analysis.analysis import Analysis
            from tui.app.launch import run_tui
            rc = run_tui(job, log_path=ranks.log_path, feed=relay_feed(ranks, Analysis()) if nodes > 1 else None)
    except DemoFailed as exc:
        failure = exc
    finally:
        killed = ranks.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        keep_log = failure is not None or bool(ranks.failed())
        if not keep_log:
            shutil.rmtree(ranks.scratch, ignore_errors=True)
    for rank in killed if chosen[0].expect != "stuck" else ():   # a hung job is ended by SIGKILL
        print(f"perfmon demo: rank {rank} did not stop within {STOP_GRACE:.0f} s and was killed", file=sys.stderr)
    if failure is not None or ranks.failed():
        why = str(failure) if failure is not None else str(DemoFailed(ranks))
        print(f"perfmon demo: {why}; log: {ranks.log_path}", file=sys.stderr)
        tail = ranks.log_tail()
        if tail:
            print(tail, file=sys.stderr)
        return 1
    if args.headless:
        print(json.dumps(report, indent=2))
    return rc
