"""The app driven through Textual's Pilot: keys, panes, picker, replay, live jobs that end or restart.

Live tests run the real probe in a subprocess (tests/integration/jobs/api_job.py,
no torch) and attach the app's own feed to its socket.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from perfmon_analysis.analysis import Analysis
from perfmon_analysis.verdict import CHART
from tests.helpers.net import free_port
from tests.tui import scenarios
from tests.tui.scenarios import screen_text, settle, wait_until
from tui.app.perfmon_app import WINDOWS, PerfmonApp
from tui.app.screens.flowchart import FlowchartScreen
from tui.app.screens.help import HelpScreen
from tui.app.screens.log import LogScreen
from tui.app.screens.picker import JobChoice, PickerScreen
from tui.app.widgets.memory import MemoryPane
from tui.stream import discovery
from tui.stream.discovery import read_token
from tui.stream.feed import LiveFeed, ReplayFeed, TcpFeed
from tui.stream.sources import load_recordings

API_JOB = Path(__file__).resolve().parents[1] / "integration" / "jobs" / "api_job.py"


def start_api_job(job: str, steps: int, *flags: str, env: dict | None = None) -> subprocess.Popen:
    """A probe-instrumented loop (data 20 ms, forward 5 ms, backward 5 ms per step)."""
    return subprocess.Popen([sys.executable, str(API_JOB), job, str(steps), "20", "5", "5", *flags],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})


def live_app(job: str) -> PerfmonApp:
    endpoints = discovery.jobs(discovery.list_endpoints()).get(job, [])
    return PerfmonApp(LiveFeed(Analysis(), job, endpoints), watch_terminal=False)


# -- keys -------------------------------------------------------------------------------------

async def test_q_quits(recordings):
    app = scenarios.replay_app(recordings["healthy"])
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        await pilot.press("q")
        await wait_until(pilot, lambda: not app.is_running, what="exit")
    assert app.return_code == 0


async def test_a_refresh_timer_firing_after_the_last_screen_went_draws_nothing(recordings):
    """The refresh timer can fire while the app closes, after its last screen left the stack."""
    app = scenarios.replay_app(recordings["stuck"])
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        await pilot.press("s")
        await settle(pilot)
    assert app.screen_stack == []
    app.refresh_view()


async def test_help_and_flowchart_open_and_close(recordings):
    app = scenarios.replay_app(recordings["load_imbalance"])
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
        await pilot.press("f")
        assert isinstance(app.screen, FlowchartScreen)
        text = screen_text(app)
        assert CHART.questions["straggler"].text in text and "now 0.5 → yes" in text
        await pilot.press("f")
        assert not isinstance(app.screen, FlowchartScreen)


async def test_number_keys_toggle_panes_and_zero_restores(recordings):
    app = scenarios.replay_app(recordings["load_imbalance"])
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        assert set(app.plan.visible) == {"device", "memory", "comm", "data", "timeline", "ranks"}
        await pilot.press("6")
        assert "ranks" not in app.plan.visible and not app.query_one("#ranks").display
        await pilot.press("2")
        assert "memory" not in app.plan.visible
        await pilot.press("0")
        assert len(app.plan.visible) == 6 and app.query_one("#ranks").display


async def test_small_terminal_keeps_verdict_pane_and_shows_a_dropped_one_on_request(recordings):
    app = scenarios.replay_app(recordings["data_preprocessing"])
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert len(app.plan.visible) == 4 and "data" in app.plan.visible
        assert app.query_one("#verdict").region.height == 3
        dropped = app.plan.dropped[0]
        await pilot.press(str(["device", "memory", "comm", "data", "timeline", "ranks"].index(dropped) + 1))
        assert dropped in app.plan.visible and len(app.plan.visible) == 4
        assert "data" in app.plan.visible   # the pane behind the verdict is never the one pushed out


async def test_rank_selection_cycles_and_clears(recordings):
    app = scenarios.replay_app(recordings["load_imbalance"])
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        await pilot.press("r")
        assert app.selected_rank == 0
        await pilot.press("r", "r")
        assert app.selected_rank == 2
        await pilot.press("R")
        assert app.selected_rank == 1
        await pilot.press("a")
        assert app.selected_rank is None


async def test_window_key_recomputes_over_a_longer_window(recordings):
    app = scenarios.replay_app(recordings["healthy"])
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        assert app.view.window["steps"] == WINDOWS[0][0]
        await pilot.press("w")
        # 80 steps recorded, the first left out: the longer window holds all the others
        assert app.view.window["steps"] == 79
        assert app.feed.analysis.window[0] == WINDOWS[1][0]


async def test_no_color_draws_categories_with_characters(recordings, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    app = scenarios.replay_app(recordings["memory"])
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        assert app.no_color
        bar = str(app.query_one(MemoryPane).render()).splitlines()[1]
        assert "▓" in bar and "▒" in bar and "█" in bar   # params, grads, optimizer told apart without colour


async def test_log_key_tails_the_job_output(tmp_path, recordings):
    log = tmp_path / "job.log"
    log.write_text("epoch 1\nloss 2.5\n")
    app = PerfmonApp(ReplayFeed(Analysis(), load_recordings(recordings["healthy"]), speed=None),
                     log_path=log, watch_terminal=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("l")
        assert isinstance(app.screen, LogScreen)
        body = app.screen.query_one("#log-body")
        await wait_until(pilot, lambda: body.line_count >= 2, what="log lines")
        with log.open("a") as fh:
            fh.write("loss 2.1\n")
        await wait_until(pilot, lambda: body.line_count >= 3, what="the appended line")
        await pilot.press("escape")
        assert not isinstance(app.screen, LogScreen)


async def test_log_screen_lists_the_probes_own_warnings(tmp_path):
    """A probe failure (a step hook raising) reaches the TUI's log screen as a warning line."""
    import probe

    mon = probe.start(job="warned", record=tmp_path, serve=False)

    def broken(extras, phases):
        raise ValueError("hook broke")
    mon.add_step_hooks(end=broken)
    for _ in range(6):
        with mon.step():
            pass
    mon.close()
    app = PerfmonApp(ReplayFeed(Analysis(), load_recordings(str(tmp_path)), speed=None), watch_terminal=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: app.view is not None and app.view.events, what="events replayed")
        await pilot.press("l")
        assert isinstance(app.screen, LogScreen)
        body = app.screen.query_one("#log-warnings")
        await wait_until(pilot, lambda: any("hook broke" in line for line in body.lines), what="warning line")
        await pilot.press("escape")
        assert not isinstance(app.screen, LogScreen)


# -- replay -----------------------------------------------------------------------------------

async def test_replay_plays_pauses_speeds_up_and_jumps_to_end(recordings):
    ticks: list[float] = []          # each replay tick reads the clock once

    def clock() -> float:
        ticks.append(time.monotonic())
        return ticks[-1]

    feed = ReplayFeed(Analysis(), load_recordings(recordings["data_preprocessing"]), speed=4.0, monotonic=clock)
    app = PerfmonApp(feed, watch_terminal=False)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_until(pilot, lambda: feed.progress > 0.05, what="replay progress")
        await pilot.press("p")
        assert feed.paused
        held, seen = feed.progress, len(ticks)
        await wait_until(pilot, lambda: len(ticks) >= seen + 3, what="three replay ticks while paused")
        assert feed.progress == held
        await pilot.press("p", "plus")
        assert not feed.paused and feed.speed == 8.0
        await pilot.press("end")
        await settle(pilot)
        assert feed.state_line() == "replay finished"
        assert app.verdict.bottleneck == "data_preprocessing"


# -- picker -----------------------------------------------------------------------------------

@pytest.mark.slow
async def test_picker_lists_jobs_and_attaches_to_the_chosen_one():
    procs = [start_api_job(name, 2000, "--linger") for name in ("job-a", "job-b")]
    try:
        for proc in procs:
            assert proc.stdout.readline().strip()
        grouped = discovery.jobs(discovery.list_endpoints())
        choices = [JobChoice(job, tuple(eps)) for job, eps in sorted(grouped.items())]
        app = PerfmonApp(None, jobs=choices, watch_terminal=False)
        async with app.run_test(size=(100, 30)) as pilot:
            assert isinstance(app.screen, PickerScreen)
            await pilot.press("down", "enter")
            await wait_until(pilot, lambda: app.view is not None and app.view.ranks, what="data from job-b")
            assert app.feed.job == "job-b" and app.view.job == "job-b"
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


# -- live jobs: exit, loss, restart, TCP ------------------------------------------------------

@pytest.mark.slow
async def test_job_exit_is_shown_and_last_data_kept():
    proc = start_api_job("short", 60, "--wait")
    try:
        assert proc.stdout.readline().strip()
        app = live_app("short")
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_until(pilot, lambda: app.feed.streams and all(
                s.state == "live" for s in app.feed.streams.values()), what="connection")
            proc.stdin.write("go\n")
            proc.stdin.flush()
            await wait_until(pilot, lambda: app.feed.state_line() == "job exited", timeout=15, what="job exit")
            app.refresh_view()
            assert app.view.ended and app.view.metrics.steps == 60
            await pilot.pause()
            assert "job exited" in screen_text(app)
            assert app.verdict.bottleneck != "warming_up"   # the last verdict stays on screen
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow
async def test_killed_probe_is_shown_as_lost():
    proc = start_api_job("doomed", 100000, "--linger")
    try:
        assert proc.stdout.readline().strip()
        app = live_app("doomed")
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_until(pilot, lambda: app.view is not None and app.view.metrics.steps > 5, what="steps")
            proc.kill()
            await wait_until(pilot, lambda: "lost" in app.feed.state_line(), what="lost stream")
            assert app.view.metrics.steps > 5
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow
async def test_restarted_rank_is_reattached():
    first = start_api_job("elastic", 100000, "--linger", env={"TORCHELASTIC_RESTART_COUNT": "0"})
    second = None
    try:
        assert first.stdout.readline().strip()
        app = live_app("elastic")
        async with app.run_test(size=(120, 36)) as pilot:
            await wait_until(pilot, lambda: app.view is not None and app.view.metrics.steps > 3, what="steps")
            first.kill()
            first.wait()
            second = start_api_job("elastic", 100000, "--linger", env={"TORCHELASTIC_RESTART_COUNT": "1"})
            assert second.stdout.readline().strip()
            await wait_until(pilot, lambda: app.view is not None and app.view.ranks
                             and app.view.ranks[0].generation == 1 and app.view.ranks[0].steps > 3,
                             timeout=15, what="the restarted rank's steps")
            assert app.view.ranks[0].pid == second.pid
            assert app.feed.state_line().startswith("live")
    finally:
        for proc in (first, second):
            if proc is not None:
                proc.kill()
                proc.wait()


@pytest.mark.slow
async def test_tcp_with_token_streams_and_a_wrong_token_is_refused(perfmon_dir):
    port = free_port()
    proc = start_api_job("remote", 100000, "--linger", env={"PERFMON_TCP": f"127.0.0.1:{port}"})
    try:
        assert proc.stdout.readline().strip()
        token_files = list(perfmon_dir.glob("*.token"))
        assert len(token_files) == 1 and oct(token_files[0].stat().st_mode & 0o777) == "0o600"
        good = PerfmonApp(TcpFeed(Analysis(), "127.0.0.1", port, read_token(None)), watch_terminal=False)
        async with good.run_test(size=(120, 36)) as pilot:
            await wait_until(pilot, lambda: good.view is not None and good.view.metrics.steps > 3, what="steps")
            assert good.view.job == "remote"
        bad = PerfmonApp(TcpFeed(Analysis(), "127.0.0.1", port, "not-the-token"), watch_terminal=False)
        async with bad.run_test(size=(120, 36)) as pilot:
            await wait_until(pilot, lambda: any(s.state == "error" for s in bad.feed.streams.values()),
                             what="refusal")
            assert "wrong token" in next(iter(bad.feed.streams.values())).message
    finally:
        proc.kill()
        proc.wait()


async def test_a_stuck_job_names_the_culprit_in_the_bar_and_s_shows_each_ranks_part_and_stack(recordings):
    from tui.app.screens.stuck import StuckScreen
    app = scenarios.replay_app(recordings["stuck"])
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        text = screen_text(app)
        assert " STUCK " in text and "Rank 1 never reached all_reduce #41 (train.py:30 in load_shard)" in text
        assert "✖ holds the job 45s" in text and "waits 45s" in text
        assert "press s: each rank's part and stack" in text
        await pilot.press("s")
        assert isinstance(app.screen, StuckScreen)
        text = screen_text(app)
        assert "rank 1 · culprit · 45s · train.py:30 in load_shard · node-a pid 4001" in text
        assert "rank 0 · waiting · 45s · in all_reduce #41 · node-a pid 4000" in text
        assert "/home/user/train.py:30 in load_shard" in text and "distributed_c10d.py:3252 in all_reduce" in text
        await pilot.press("s")
        assert not isinstance(app.screen, StuckScreen)


async def test_the_stuck_screen_says_so_when_nothing_is_stuck(recordings):
    from tui.app.screens.stuck import StuckScreen
    app = scenarios.replay_app(recordings["healthy"])
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        await pilot.press("s")
        assert isinstance(app.screen, StuckScreen)
        assert "Nothing is stuck: every rank made progress" in screen_text(app)


def test_screens_redrawn_by_the_refresh_timer_before_they_are_composed_keep_the_data_for_later():
    """The app's timer may call ``show`` between ``push_screen`` and the screen's compose."""
    from tui.app.screens.stuck import StuckScreen
    screen = StuckScreen(None)
    screen.show(None)
    assert screen.stuck is None


async def test_m_shows_the_recorded_profile_and_says_a_recording_cannot_be_asked(tmp_path, monkeypatch):
    def profiled():
        ranks = scenarios.healthy()
        t = ranks[0][-1]["t"]
        ranks[0].append({"k": "profile", "t": t, "id": 1, "steps": 5, "first_step": 10, "last_step": 14, "depth": 1,
                         "step_s": 0.01, "timer": "perf_counter", "modules": [
                             {"name": "", "type": "ResNet", "depth": 0, "params": 10, "calls": 1.0, "fwd_s": 0.003,
                              "bwd_s": 0.005, "flops": 9e9, "fwd_flops": 3e9},
                             {"name": "layer1", "type": "Sequential", "depth": 1, "params": 5, "calls": 1.0,
                              "fwd_s": 0.0005, "bwd_s": 0.001, "flops": 3e9, "fwd_flops": 1e9},
                             {"name": "layer2", "type": "Sequential", "depth": 1, "params": 5, "calls": 1.0,
                              "fwd_s": 0.002, "bwd_s": 0.004, "flops": 3e9, "fwd_flops": 1e9}]})
        return ranks

    monkeypatch.setitem(scenarios.SCENARIOS, "profiled", profiled)
    app = scenarios.replay_app(scenarios.write("profiled", tmp_path))
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        await pilot.press("m")
        await wait_until(pilot, lambda: "Marked ▶ layer2" in screen_text(app), what="the profile screen")
        text = screen_text(app)
        assert "a recording cannot be asked: attach to the live job" in text
        assert "▶   layer2" in text and "60%" in text
        await pilot.press("escape")
        await wait_until(pilot, lambda: "Marked" not in screen_text(app), what="back to the main screen")


async def test_c_shows_each_ranks_recorded_capture(tmp_path, monkeypatch):
    def captured():
        ranks = scenarios.healthy()
        for rank, records in ranks.items():
            records.append({"k": "capture", "t": records[-1]["t"], "id": 2, "steps": 3, "first_step": 7,
                            "last_step": 9, "wall_s": 0.3, "path": f"/runs/r{rank}.capture-7.pt.trace.json.gz",
                            "top": [{"name": "aten::addmm", "self_s": 0.012, "calls": 30}], "gaps": []})
        return ranks

    monkeypatch.setitem(scenarios.SCENARIOS, "captured", captured)
    app = scenarios.replay_app(scenarios.write("captured", tmp_path))
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        await pilot.press("c")
        await wait_until(pilot, lambda: "/runs/r1.capture-7" in screen_text(app), what="the capture screen")
        text = screen_text(app)
        assert "rank 0: steps 7-9 -> /runs/r0.capture-7.pt.trace.json.gz" in text
        assert "12.00 ms      30x  aten::addmm" in text
        assert "a recording cannot be asked" in text


async def test_a_job_of_1024_ranks_is_a_heatmap_paged_with_brackets(tmp_path, monkeypatch):
    """128 nodes x 8 ranks: the ranks pane spans the width, names the slowest rank and its node,
    and ``]``/``[`` move the selection a page at a time."""
    monkeypatch.setitem(scenarios.SCENARIOS, "huge", lambda: scenarios.many_nodes(128, 8, slow_rank=700, steps=8))
    app = scenarios.replay_app(scenarios.write("huge", tmp_path))
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        text = screen_text(app)
        assert "slowest rank 700 on n88: compute 1.60x the fastest" in text
        pages = re.search(r"ranks 0\.\.(\d+) of 1024, page 1/(\d+)", text)
        assert pages, text
        per_page, count = int(pages[1]) + 1, int(pages[2])
        assert per_page * (count - 1) < 1024 <= per_page * count
        await pilot.press("right_square_bracket")
        assert app.selected_rank == per_page
        assert f"ranks {per_page}..{2 * per_page - 1} of 1024, page 2/{count}" in screen_text(app)
        await pilot.press("left_square_bracket", "left_square_bracket")
        assert app.selected_rank == 0 and "page 1/" in screen_text(app)
        await pilot.press("g")                   # the slowest rank, and the page it is on
        assert app.selected_rank == 700 and f"page {700 // per_page + 1}/{count}" in screen_text(app)


async def test_u_opens_where_the_step_goes_with_each_lines_share_and_error_bar(recordings):
    from tui.app.screens.where import WhereScreen
    app = scenarios.replay_app(recordings["host_wait"])
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        text = screen_text(app)
        assert " HOST WAIT " in text and "u: where" in text
        assert "40% of each step waiting in socket.socket.recv_into at train.py:21 in fetch_from_service" in text
        await pilot.press("u")
        assert isinstance(app.screen, WhereScreen)
        text = screen_text(app)
        # three 2 s intervals overlap the 5 s window: 48 of 120 samples in a body that is the whole step,
        # 40% ± the Wilson half-width of 48/120 (8.6%)
        rows = [re.sub(r"\s+", " ", line).strip() for line in text.splitlines()]
        assert any(r.startswith("40% ± 9% waiting in step socket.socket.recv_into train.py:21 in fetch_from_service")
                   for r in rows), text
        assert any(r.startswith("30% ± 8% busy in step torch.nn.modules.module._call_impl train.py:44 in train")
                   for r in rows), text
        assert "waiting, no measured cause: 40% of the step" in text
        await pilot.press("u")
        assert not isinstance(app.screen, WhereScreen)


async def test_the_where_screen_says_so_when_the_probe_sends_no_stack_samples(recordings):
    from tui.app.screens.where import WhereScreen
    app = scenarios.replay_app(recordings["healthy"])
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        assert "u: where" not in screen_text(app)
        await pilot.press("u")
        assert isinstance(app.screen, WhereScreen)
        assert "No stack samples from this job" in screen_text(app)
