"""Opening the TUI: the terminal check and the app over a feed, shared by ``perfmon attach``,
``perfmon run`` and ``perfmon demo`` so that no command imports another."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from probe import paths
from tui.errors import UserError


def needs_terminal() -> None:
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UserError("needs a terminal (run it in an SSH session with -t, or in tmux); "
                        "for a text summary use `perfmon report TARGET`")


def app_for(feed: Any, *, jobs: Any = None, log_path: Path | None = None,
            on_signal: Callable[[int], None] | None = None, price: float | None = None) -> Any:
    """The app over ``feed`` (or a job picker over ``jobs``); Textual is imported only here.
    ``price``: per device-hour, for the money of what fixing the bottleneck buys."""
    from tui.app.perfmon_app import PerfmonApp
    return PerfmonApp(feed, jobs=jobs, log_path=log_path, on_signal=on_signal, price=price)


def run_app(app: Any) -> int:
    """Run the app to its end; quitting (or Ctrl-C, 129) is success."""
    result = app.run()
    return 0 if result in (None, 0, 129) else int(result)


def run_tui(target_job: str, log_path: Path | None = None,
            on_signal: Callable[[int], None] | None = None, feed: Any = None) -> int:
    """Open the TUI on a job that ``perfmon run`` just started, with ``l`` showing its output file.

    The job's probes may not be listening yet: the feed attaches to every rank as its socket appears.
    ``feed``: another feed to watch it through (``perfmon demo --nodes``: a relay per node).
    SIGTERM/SIGHUP close the TUI; ``on_signal`` is called first so the caller can pass them on.
    """
    needs_terminal()
    if feed is None:
        from perfmon_analysis.analysis import Analysis
        from tui.stream import discovery
        from tui.stream.feed import LiveFeed
        endpoints = discovery.jobs(discovery.list_endpoints()).get(paths.safe_job(target_job), [])
        feed = LiveFeed(Analysis(), paths.safe_job(target_job), endpoints)
    return run_app(app_for(feed, log_path=log_path, on_signal=on_signal))
