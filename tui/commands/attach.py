"""``perfmon attach [TARGET]``: resolve what to watch, then open the TUI.

TARGET is a recording file or directory (replayed), ``host:port`` (TCP through
an SSH tunnel, with the probe's token), a socket path, a pid or a job name.
Without TARGET: the only job of this user on this node, a picker when there
are several, or one line saying that none runs and how to start one. Every
user mistake is a ``UserError`` (one line, exit 2) raised before the screen opens.
"""

from __future__ import annotations

import os
from pathlib import Path

from perfmon_analysis.analysis import Analysis
from probe import paths
from tui.app.launch import app_for, needs_terminal, run_app
from tui.errors import UserError
from tui.pricing import price_per_device_hour
from tui.stream import discovery
from tui.stream.connect import remote_feed


def build_app(target: str | None, *, token: str | None = None, speed: float | None = 1.0,
              log_path: Path | None = None, price: float | None = None):
    """The app for TARGET, or UserError. Imports Textual only once the target makes sense.
    ``price``: per device-hour, for what fixing the bottleneck buys."""
    from tui.stream.discovery import parse_host_port, read_token
    from tui.stream.feed import LiveFeed, ReplayFeed, TcpFeed
    from tui.stream.sources import is_recording_target, load_recordings

    if target is not None and is_recording_target(target):
        recordings = load_recordings(target)
        feed = ReplayFeed(Analysis(), recordings, speed=speed)
        return app_for(feed, log_path=log_path, price=price)
    if target is not None and not os.path.exists(target):
        host_port = parse_host_port(target)
        if host_port is not None:
            return app_for(TcpFeed(Analysis(), host_port[0], host_port[1], read_token(token)), log_path=log_path,
                           price=price)
    if target is None:
        grouped = discovery.jobs(discovery.list_endpoints())
        if not grouped:
            raise UserError(f"no perfmon job is running for this user on this node ({paths.socket_dir()}); "
                            "start one with `perfmon run -- python train.py`, `probe.start()` in the script, "
                            "or try `perfmon demo`")
        if len(grouped) > 1:
            from tui.app.screens.picker import choices
            return app_for(None, jobs=choices(grouped), log_path=log_path, price=price)
        job, endpoints = next(iter(grouped.items()))
        return app_for(LiveFeed(Analysis(), job, endpoints), log_path=log_path, price=price)
    endpoints = discovery.resolve_live(target)
    job = endpoints[0].job
    # a socket path or pid names one process; the job's other ranks come along when it has any
    return app_for(LiveFeed(Analysis(), job, endpoints), log_path=log_path, price=price)


def main(args) -> int:
    speed = args.speed
    if speed is not None and speed <= 0:
        raise UserError("--speed must be positive")
    price = price_per_device_hour(args.price_per_device_hour)
    remote = remote_feed(args)
    app = app_for(remote, price=price) if remote is not None else \
        build_app(args.target, token=args.token, speed=speed, price=price)
    needs_terminal()
    return run_app(app)
