"""The Textual app behind ``perfmon attach``: layout, keys, the refresh timer, terminal loss.

Data flow: a feed (``tui.stream.feed``) runs as one asyncio worker and ingests every
record into its ``RunModel``; a timer (4 Hz by default) takes one ``JobView``
and one ``Verdict`` and hands them to the visible panes inside
``batch_update()``. Nothing is redrawn per record, hidden panes are not drawn
at all, and a paused live view keeps ingesting so nothing is lost.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Grid

from perfmon_analysis.analysis import Analysis
from perfmon_analysis.heatmap import heatmap
from perfmon_analysis.verdict import Verdict
from perfmon_analysis.views import JobView
from tui.app.screens.asking import AskScreen
from tui.app.screens.capture import CaptureScreen
from tui.app.screens.flowchart import FlowchartScreen
from tui.app.screens.help import HelpScreen
from tui.app.screens.log import LogScreen
from tui.app.screens.picker import JobChoice, PickerScreen
from tui.app.screens.profile import ProfileScreen
from tui.app.screens.stuck import StuckScreen
from tui.app.screens.trends import TrendsScreen
from tui.app.screens.where import WhereScreen
from tui.app.widgets.comm import CommPane
from tui.app.widgets.data import DataPane, worst_data_rank
from tui.app.widgets.device import DevicePane
from tui.app.widgets.header import HeaderBar
from tui.app.widgets.keyline import KeyLine
from tui.app.widgets.layout import HEATMAP_RANKS, PANE_ORDER, Plan, pane_key, plan
from tui.app.widgets.memory import MemoryPane
from tui.app.widgets.pane import Pane, UiState, focus_rank
from tui.app.widgets.ranks import RanksPane
from tui.app.widgets.timeline import TimelinePane
from tui.app.widgets.verdictbar import VerdictBar
from tui.stream.feed import Feed, LiveFeed, ReplayFeed

PANE_CLASSES: tuple[type[Pane], ...] = (DevicePane, MemoryPane, CommPane, DataPane, TimelinePane, RanksPane)
# (steps, seconds) windows the ``w`` key cycles through; the first is the run model's default window.
WINDOWS = ((50, 30.0), (200, 120.0), (1000, 600.0))
TERMINAL_CHECK_SECONDS = 1.0
FORCED_EXIT_SECONDS = 3.0      # if a clean exit hangs on a dead terminal, leave anyway
FEED_CLOSE_SECONDS = 5.0       # q: at most this long to stop the relays a feed started
FIRST_SCREEN_TRIES = 60        # at most 60 tries after the first records arrive...
FIRST_SCREEN_PAUSE = 4.0       # ...each after a pause of 50 ms or 4x the last one's cost
REFRESH_BUDGET = 0.10          # share of a core the timer's refreshes may take before it refreshes less often
SLOWEST_REFRESH_S = 0.5        # ...but at least twice a second: a view lagging its job by more reads as frozen


def ticks_to_skip(cost_s: float, tick_s: float) -> int:
    """Timer ticks to let pass after a refresh that took ``cost_s`` of the loop, so that refreshing
    takes about ``REFRESH_BUDGET`` of a core: none for a job of a few ranks (a few ms a refresh),
    every other one at a thousand ranks, where deriving the view takes tens of ms and the
    summaries behind most of it change once a second."""
    interval = min(SLOWEST_REFRESH_S, cost_s / REFRESH_BUDGET)
    return max(0, math.ceil(interval / tick_s - 1e-9) - 1)


class PerfmonApp(App[int]):
    """Live (or replayed) view of one job. Give it a feed, or a list of jobs to pick from."""

    CSS_PATH = "app.tcss"
    TITLE = "perfmon"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [
        Binding("q", "quit", "quit"),
        Binding("ctrl+c", "quit", "quit", show=False, priority=True),   # as in htop/btop
        Binding("question_mark,h,f1", "help", "help"),
        Binding("f", "flowchart", "flowchart"),
        Binding("p,space", "pause", "pause"),
        *[Binding(pane_key(name), f"toggle_pane('{name}')", name, show=False) for name in PANE_ORDER],
        Binding("0", "reset_panes", "all panes", show=False),
        Binding("r", "rank(1)", "next rank", show=False),
        Binding("R", "rank(-1)", "previous rank", show=False),
        Binding("a", "all_ranks", "all ranks", show=False),
        Binding("right_square_bracket", "rank_page(1)", "next page of ranks", show=False),
        Binding("left_square_bracket", "rank_page(-1)", "previous page of ranks", show=False),
        Binding("g", "slowest_rank", "select the slowest rank", show=False),
        Binding("number_sign", "goto_rank", "select a rank by number", show=False),
        Binding("w", "window", "window", show=False),
        Binding("plus,equals_sign", "speed(1)", "faster", show=False),
        Binding("minus", "speed(-1)", "slower", show=False),
        Binding("end", "to_end", "end", show=False),
        Binding("l", "log", "log", show=False),
        Binding("s", "stuck", "stacks", show=False),
        Binding("u", "where", "where the step goes", show=False),
        Binding("t", "trends", "the whole run's trends", show=False),
        Binding("m", "ask('profile')", "module profile", show=False),
        Binding("c", "ask('capture')", "torch.profiler capture", show=False),
        Binding("f8", "screenshot_svg", "screenshot", show=False),
        Binding("right", "app.focus_next", "next pane", show=False),
        Binding("left", "app.focus_previous", "previous pane", show=False),
    ]

    def __init__(self, feed: Feed | None = None, *, jobs: list[JobChoice] | None = None,
                 log_path: Path | None = None, refresh_hz: float = 4.0, watch_terminal: bool = True,
                 on_signal: Callable[[int], None] | None = None, price: float | None = None) -> None:
        super().__init__()
        self.on_signal = on_signal   # `perfmon run` forwards SIGTERM/SIGHUP to its job before we exit
        self.feed = feed
        self.jobs = jobs or []
        self.log_path = log_path
        self.refresh_hz = refresh_hz
        self.watch_terminal = watch_terminal
        self.view: JobView | None = None
        self.verdict: Verdict | None = None
        self.selected_rank: int | None = None
        self.window_index = 0
        self.display_paused = False
        self.hidden: set[str] = set()
        self.shown: set[str] = set()
        self.plan: Plan | None = None
        self._panes: dict[str, Pane] = {}
        self._header = HeaderBar()
        self._verdict_bar = VerdictBar()
        self._verdict_bar.price = price      # per device-hour (--price-per-device-hour)
        self._skip_ticks = 0

    # -- layout -----------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield self._header
        with Grid(id="panes"):
            for cls in PANE_CLASSES:
                pane = cls()
                self._panes[cls.NAME] = pane
                yield pane
        yield self._verdict_bar
        yield KeyLine(extra=(("l", "log"),) if self.log_path else ())

    def on_mount(self) -> None:
        self._relayout()
        self.set_interval(1.0 / self.refresh_hz, self._tick)
        if self.watch_terminal and not self.is_headless:
            self._watch_terminal()
        if self.feed is not None:
            self._start_feed(self.feed)
        elif self.jobs:
            self.push_screen(PickerScreen(self.jobs), callback=self._picked)

    def on_resize(self) -> None:
        self._relayout()

    def _relayout(self) -> None:
        view = self.view
        new = plan(self.size.width, self.size.height,
                   lead=self.verdict.outcome.pane if self.verdict else None,
                   hidden=frozenset(self.hidden), shown=frozenset(self.shown),
                   multi_rank=view is not None and len(view.ranks) > 1,
                   many_ranks=view is not None and len(view.ranks) > HEATMAP_RANKS)
        if new == self.plan:
            return
        self.plan = new
        grid = self.query_one("#panes", Grid)
        grid.styles.grid_size_columns = new.columns
        for name, pane in self._panes.items():
            pane.display = name in new.visible
            pane.styles.column_span = new.columns if name in new.wide else 1
        self.query_one(KeyLine).show(new.dropped)
        if self.view is not None:
            self._draw()

    # -- data -------------------------------------------------------------------------------
    def _start_feed(self, feed: Feed) -> None:
        self.feed = feed
        self.run_worker(self._run_feed(feed), name="feed", group="feed", exclusive=True, exit_on_error=False)

    async def _run_feed(self, feed: Feed) -> None:
        first = asyncio.ensure_future(self._first_screen(feed))
        try:
            await feed.run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug in a feed must not take the screen down: show it in one line
            feed.analysis.add_problem(f"reader stopped: {exc!r}"[:200])
        finally:
            if not first.done():
                first.cancel()
        self.refresh_view()

    async def _first_screen(self, feed: Feed) -> None:
        """Right after attaching, refresh often until the first verdict is confirmed (the tracker
        wants two agreeing evaluations), instead of making the user wait for two ticks: at 20 Hz,
        or at a fifth of the loop where a refresh is costly (a thousand ranks), which leaves the
        CPU to the readers and relays still filling the view."""
        await feed.first_data.wait()
        cost = 0.0
        for _ in range(FIRST_SCREEN_TRIES):
            await asyncio.sleep(max(0.05, FIRST_SCREEN_PAUSE * cost))
            cost = self._timed_refresh()
            verdict = self.verdict
            if verdict is not None and verdict.pending is None and verdict.bottleneck != "warming_up":
                return

    async def action_quit(self) -> None:
        """``q``: release what the feed started (a relay per host) before the loop ends, then exit."""
        if self.feed is not None:
            try:
                await asyncio.wait_for(self.feed.aclose(), FEED_CLOSE_SECONDS)
            except (asyncio.TimeoutError, OSError):
                pass
        self.exit()

    def _picked(self, choice: JobChoice | None) -> None:
        if choice is None:
            self.exit(0)
            return
        steps, seconds = WINDOWS[self.window_index]
        self._start_feed(LiveFeed(Analysis(window_steps=steps, window_seconds=seconds), choice.job,
                                  list(choice.endpoints)))

    def _tick(self) -> None:
        """The refresh timer (``refresh_hz``), thinned by what the last refresh cost (``ticks_to_skip``)."""
        if self._skip_ticks > 0:
            self._skip_ticks -= 1
            return
        self._skip_ticks = ticks_to_skip(self._timed_refresh(), 1.0 / self.refresh_hz)

    def _timed_refresh(self) -> float:
        t0 = time.perf_counter()
        self.refresh_view()
        return time.perf_counter() - t0

    def refresh_view(self) -> None:
        """One view, one verdict, every visible pane drawn once (the timer, a key, the feed's end)."""
        feed = self.feed
        if feed is None or (self.display_paused and not feed.is_replay):
            return
        if not self.screen_stack:
            return      # the app is closing: a timer may fire after its last screen went
        snap = feed.analysis.snapshot(feed.now(), clock=feed.clock(), steady=True)
        self.view, self.verdict = snap.view, snap.verdict
        feed.follow(self._followed(self.view))
        follow_ranks = getattr(feed, "follow_ranks", None)     # through a relay tree: any rank, by number
        if follow_ranks is not None:
            follow_ranks(set() if self.selected_rank is None else {self.selected_rank})
        self._relayout()
        self._draw()
        if isinstance(self.screen, FlowchartScreen):
            self.screen.show(self.verdict)
        elif isinstance(self.screen, StuckScreen):
            self.screen.show(self.view.stuck)
        elif isinstance(self.screen, WhereScreen):
            self.screen.show(self.verdict)
        elif isinstance(self.screen, TrendsScreen):
            self.screen.show(feed.analysis.history)
        elif isinstance(self.screen, AskScreen):
            self.screen.show(self.view)

    def _followed(self, view: JobView) -> set[str]:
        """The streams whose step records the panes draw (through relays the others are summaries):
        the focus rank's (timeline, memory) and, with no rank selected, the data pane's worst rank."""
        focus = {focus_rank(view, UiState(selected_rank=self.selected_rank), self.verdict)}
        if self.selected_rank is None:
            focus.add(worst_data_rank(view))
        return {r.stream for r in view.ranks if r.rank in focus}

    def _draw(self) -> None:
        feed, view = self.feed, self.view
        if feed is None or view is None or not self._header.is_attached:
            return      # nothing yet, or the app is tearing its widgets down while a timer fires
        state = feed.state_line()
        if self.display_paused and not feed.is_replay:
            state = f"{state}, PAUSED (p resumes)"
        if view.problems:
            state = f"{state} · {view.problems[-1]}"
        steps, seconds = WINDOWS[self.window_index]
        ui = UiState(selected_rank=self.selected_rank, mono=self.no_color,
                     window_label=f"w: max {steps} steps/{seconds:g}s", feed_state=state,
                     feed_flowing=feed.flowing and not (self.display_paused and not feed.is_replay))
        with self.batch_update():
            self._header.show(view, ui, feed.description)
            for name in (self.plan.visible if self.plan else ()):
                self._panes[name].show(view, self.verdict, ui)
            if self.verdict is not None:
                self._verdict_bar.show(self.verdict, self.no_color)

    # -- actions ----------------------------------------------------------------------------
    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_flowchart(self) -> None:
        if not isinstance(self.screen, FlowchartScreen):
            self.push_screen(FlowchartScreen(self.verdict, self.no_color))

    def action_goto_rank(self) -> None:
        """``#``: a rank by number; through a relay tree one the ranks pane does not hold comes in full."""
        from tui.app.screens.goto import GotoRankScreen

        def chosen(rank: int | None) -> None:
            if rank is not None:
                self.selected_rank = rank
                self.refresh_view()
        self.push_screen(GotoRankScreen(self.view.world_size if self.view is not None else 0), chosen)

    def action_stuck(self) -> None:
        if not isinstance(self.screen, StuckScreen):
            self.push_screen(StuckScreen(self.view.stuck if self.view is not None else None))

    def action_where(self) -> None:
        if not isinstance(self.screen, WhereScreen):
            self.push_screen(WhereScreen(self.verdict))

    def action_trends(self) -> None:
        if not isinstance(self.screen, TrendsScreen):
            self.push_screen(TrendsScreen(self.feed.analysis.history if self.feed is not None else None))

    def action_ask(self, op: str) -> None:
        """``m`` (module profile), ``c`` (torch.profiler capture): ask the selected rank, else the lowest."""
        if isinstance(self.screen, AskScreen) or self.feed is None or self.view is None:
            return
        ranks = self.view.ranks
        row = next((r for r in ranks if r.rank == self.selected_rank), ranks[0] if ranks else None)
        target = self.feed.request_target(row.stream) if row is not None else "no rank has reported yet"
        screen = ProfileScreen if op == "profile" else CaptureScreen
        self.push_screen(screen(self.view, target, f"rank {row.rank}" if row else "the job"))

    def action_pause(self) -> None:
        if self.feed is None:
            return
        if self.feed.is_replay:
            self.feed.paused = not self.feed.paused
        else:
            self.display_paused = not self.display_paused
            if not self.display_paused:
                self.refresh_view()
                return
        self._draw()

    def action_toggle_pane(self, name: str) -> None:
        visible = self.plan is not None and name in self.plan.visible
        if visible:
            self.hidden.add(name)
            self.shown.discard(name)
        else:
            self.shown.add(name)
            self.hidden.discard(name)
        self._relayout()

    def action_reset_panes(self) -> None:
        self.hidden.clear()
        self.shown.clear()
        self._relayout()

    def action_rank(self, step: int) -> None:
        ranks = [r.rank for r in self.view.ranks] if self.view is not None else []
        if not ranks:
            return
        if self.selected_rank not in ranks:
            self.selected_rank = ranks[0] if step > 0 else ranks[-1]
        else:
            self.selected_rank = ranks[(ranks.index(self.selected_rank) + step) % len(ranks)]
        self._draw()

    def action_rank_page(self, step: int) -> None:
        """``]``/``[``: the selection moves a heatmap page of ranks (nothing without a heatmap)."""
        pane = self._panes.get("ranks")
        per_page = pane.page_ranks if isinstance(pane, RanksPane) else 0
        order = list(heatmap(self.view).ranks) if self.view is not None else []   # by node, then rank
        if not per_page or not order:
            return
        at = order.index(self.selected_rank) if self.selected_rank in order else 0
        self.selected_rank = order[max(0, min(len(order) - 1, at + step * per_page))]
        self._draw()

    def action_slowest_rank(self) -> None:
        """``g``: select the rank the heatmap names slowest (its page comes with it)."""
        slowest = heatmap(self.view).slowest_rank if self.view is not None else None
        if slowest is not None:
            self.selected_rank = slowest
            self._draw()

    def action_all_ranks(self) -> None:
        self.selected_rank = None
        self._draw()

    def action_window(self) -> None:
        if self.feed is None:
            return
        self.window_index = (self.window_index + 1) % len(WINDOWS)
        self.feed.analysis.set_window(*WINDOWS[self.window_index])
        self.refresh_view()

    def action_speed(self, direction: int) -> None:
        feed = self.feed
        if isinstance(feed, ReplayFeed):
            feed.faster() if direction > 0 else feed.slower()
            self._draw()

    def action_to_end(self) -> None:
        if isinstance(self.feed, ReplayFeed):
            self.feed.to_end()

    def action_log(self) -> None:
        if not isinstance(self.screen, LogScreen):   # job output (perfmon run) and the probe's warnings
            self.push_screen(LogScreen(self.log_path, warnings=self._recent_events))

    def _recent_events(self) -> list[dict[str, Any]]:
        return list(self.view.events) if self.view is not None else []

    def action_screenshot_svg(self) -> None:
        try:
            path = self.save_screenshot(path=os.getcwd())
        except OSError as exc:
            self.notify(f"screenshot failed: {exc.strerror or exc}", severity="error")
            return
        self.notify(f"saved {path}", timeout=4)

    # -- terminal loss (SSH drop, closed tmux pane) -------------------------------------------
    def _watch_terminal(self) -> None:
        try:
            loop = asyncio.get_running_loop()
            loop.add_signal_handler(signal.SIGHUP, self._signalled, signal.SIGHUP)
            loop.add_signal_handler(signal.SIGTERM, self._signalled, signal.SIGTERM)
        except (NotImplementedError, RuntimeError, ValueError):
            pass
        self.set_interval(TERMINAL_CHECK_SECONDS, self._check_terminal)

    def _signalled(self, signum: int) -> None:
        if self.on_signal is not None:
            self.on_signal(signum)
        if signum == signal.SIGHUP:
            self._terminal_gone()
        else:
            self.exit(143)

    def _check_terminal(self) -> None:
        if not terminal_alive():
            self._terminal_gone()

    def _terminal_gone(self) -> None:
        """No one can see us any more: exit, and make sure a write blocked on the dead tty cannot hold us."""
        timer = threading.Timer(FORCED_EXIT_SECONDS, os._exit, args=(129,))
        timer.daemon = True
        timer.start()
        self.exit(129)


def terminal_alive() -> bool:
    """A hung-up tty stops being a tty (tcgetattr fails with EIO), which is what isatty checks."""
    stream = sys.__stdin__
    try:
        return stream is not None and os.isatty(stream.fileno())
    except (OSError, ValueError):
        return False
