"""``perfmon attach [TARGET]``: resolve what to watch, then open the TUI.

TARGET is a recording file or directory (replayed), ``host:port`` (TCP through
an SSH tunnel, with the probe's token), a socket path, a pid or a job name.
Without TARGET: the only job of this user on this node, a picker when there
are several, or one line saying that none runs and how to start one. Every
user mistake is a ``UserError`` (one line, exit 2) raised before the screen opens.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable

from probe import paths
from tui.stream import discovery
from tui.errors import UserError


def _needs_terminal() -> None:
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UserError("needs a terminal (run it in an SSH session with -t, or in tmux); "
                        "for a text summary use `perfmon report TARGET`")


def build_app(target: str | None, *, token: str | None = None, speed: float | None = 1.0,
              log_path: Path | None = None):
    """The app for TARGET, or UserError. Imports Textual only once the target makes sense."""
    from tui.stream.discovery import parse_host_port, read_token
    from tui.stream.feed import LiveFeed, ReplayFeed, TcpFeed
    from perfmon_analysis.runmodel import RunModel
    from tui.stream.sources import is_recording_target, load_recordings

    if target is not None and is_recording_target(target):
        recordings = load_recordings(target)
        feed = ReplayFeed(RunModel(), recordings, speed=speed)
        return _app(feed, log_path=log_path)
    if target is not None and not os.path.exists(target):
        host_port = parse_host_port(target)
        if host_port is not None:
            return _app(TcpFeed(RunModel(), host_port[0], host_port[1], read_token(token)), log_path=log_path)
    if target is None:
        grouped = discovery.jobs(discovery.list_endpoints())
        if not grouped:
            raise UserError(f"no perfmon job is running for this user on this node ({paths.socket_dir()}); "
                            "start one with `perfmon run -- python train.py`, `probe.start()` in the script, "
                            "or try `perfmon demo`")
        if len(grouped) > 1:
            from tui.app.screens.picker import choices
            return _app(None, jobs=choices(grouped), log_path=log_path)
        job, endpoints = next(iter(grouped.items()))
        return _app(LiveFeed(RunModel(), job, endpoints), log_path=log_path)
    endpoints = discovery.resolve_live(target)
    job = endpoints[0].job
    # a socket path or pid names one process; the job's other ranks come along when it has any
    return _app(LiveFeed(RunModel(), job, endpoints), log_path=log_path)


def remote_feed(args):
    """A ``RelayFeed`` when ``--hosts``/``--hostfile``/``--slurm`` name the job's nodes, else None."""
    from tui.stream import hosts
    found = hosts.choose_hosts(getattr(args, "hosts", None), getattr(args, "hostfile", None),
                               getattr(args, "slurm", None))
    if found is None:
        return None
    if not args.target:
        raise UserError("name the job to follow on those hosts (perfmon ls on a node lists them)")
    from perfmon_analysis.runmodel import RunModel
    from tui.stream.remote import RelayFeed
    via = args.via or os.environ.get("PERFMON_VIA") or hosts.DEFAULT_VIA
    port = getattr(args, "relay_port", None)
    if port is None:
        return RelayFeed(RunModel(), args.target, found, via)
    if not 0 < port < 65536:
        raise UserError(f"--relay-port {port}: must be 1..65535")
    token = getattr(args, "token", None) or os.environ.get("PERFMON_TOKEN")
    if not token:
        raise UserError("--relay-port needs the relays' token: --token TOKEN or PERFMON_TOKEN "
                        "(set the same PERFMON_TOKEN for 'perfmon relay --tcp' on every host)")
    return RelayFeed(RunModel(), args.target, found, via, port=port, token=token)


def _app(feed, *, jobs=None, log_path=None, on_signal=None):
    from tui.app.perfmon_app import PerfmonApp
    return PerfmonApp(feed, jobs=jobs, log_path=log_path, on_signal=on_signal)


def run_tui(target_job: str, log_path: Path | None = None,
            on_signal: Callable[[int], None] | None = None, feed=None) -> int:
    """Open the TUI on a job that ``perfmon run`` just started, with ``l`` showing its output file.

    The job's probes may not be listening yet: the feed attaches to every rank as its socket appears.
    ``feed``: another feed to watch it through (``perfmon demo --nodes``: a relay per node).
    SIGTERM/SIGHUP close the TUI; ``on_signal`` is called first so the caller can pass them on.
    """
    _needs_terminal()
    from tui.stream.feed import LiveFeed
    from perfmon_analysis.runmodel import RunModel
    if feed is None:
        endpoints = discovery.jobs(discovery.list_endpoints()).get(paths.safe_job(target_job), [])
        feed = LiveFeed(RunModel(), paths.safe_job(target_job), endpoints)
    app = _app(feed, log_path=log_path, on_signal=on_signal)
    result = app.run()
    return 0 if result in (None, 0, 129) else int(result)


def main(args) -> int:
    speed = args.speed
    if speed is not None and speed <= 0:
        raise UserError("--speed must be positive")
    remote = remote_feed(args)
    app = _app(remote) if remote is not None else build_app(args.target, token=args.token, speed=speed)
    _needs_terminal()
    result = app.run()
    return 0 if result in (None, 0, 129) else int(result)
