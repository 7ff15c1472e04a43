"""TARGET resolution, user errors as one line, the layout plan, and terminal-loss detection."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from types import SimpleNamespace

import pytest

from tui.app import perfmon_app as app_module
from tui.app.widgets.layout import plan
from tui.commands.attach import build_app
from tui.errors import UserError
from tui.stream.discovery import parse_host_port, read_token
from tui.stream.feed import LiveFeed, ReplayFeed, TcpFeed

# -- TARGET -----------------------------------------------------------------------------------

def test_no_job_says_so_and_how_to_start_one():
    with pytest.raises(UserError) as exc:
        build_app(None)
    message = str(exc.value)
    assert "no perfmon job is running" in message and "perfmon run" in message and "\n" not in message


def test_unknown_job_name_is_one_line():
    with pytest.raises(UserError, match="no job named 'nope'"):
        build_app("nope")


def test_recording_directory_is_replayed(recordings):
    app = build_app(str(recordings["healthy"]), speed=2.0)
    assert isinstance(app.feed, ReplayFeed) and app.feed.speed == 2.0 and len(app.feed.streams) == 2


def test_file_that_is_not_a_recording_is_one_line(tmp_path):
    bogus = tmp_path / "notes.txt"
    bogus.write_text("hello")
    with pytest.raises(UserError, match="not a perfmon recording"):
        build_app(str(bogus))


def test_host_port_needs_a_token_and_uses_the_one_given():
    with pytest.raises(UserError, match="needs the probe's token"):
        build_app("127.0.0.1:29555")
    app = build_app("127.0.0.1:29555", token="s3cret")
    assert isinstance(app.feed, TcpFeed) and (app.feed.host, app.feed.port, app.feed.token) == (
        "127.0.0.1", 29555, "s3cret")


def test_host_port_parsing():
    assert parse_host_port("node7:29555") == ("node7", 29555)
    assert parse_host_port(":29555") == ("127.0.0.1", 29555)
    assert parse_host_port("my-job") is None and parse_host_port("a/b:1") is None
    with pytest.raises(UserError, match="1..65535"):
        parse_host_port("localhost:70000")


def test_token_file_beside_the_sockets_is_found(perfmon_dir):
    (perfmon_dir / "job.r0.x0.p1.token").write_text("abc\n")
    assert read_token(None) == "abc"
    (perfmon_dir / "job.r1.x0.p2.token").write_text("def\n")
    with pytest.raises(UserError, match="2 token files"):
        read_token(None)


def test_several_jobs_open_the_picker(monkeypatch):
    from tui.stream.discovery import Endpoint
    eps = [Endpoint("a", 0, 0, 11, "/x/a.sock", 1.0), Endpoint("b", 0, 0, 12, "/x/b.sock", 2.0)]
    monkeypatch.setattr("tui.stream.discovery.list_endpoints", lambda directory=None: eps)
    app = build_app(None)
    assert app.feed is None and [c.job for c in app.jobs] == ["a", "b"]


def test_one_job_attaches_all_its_ranks(monkeypatch):
    from tui.stream.discovery import Endpoint
    eps = [Endpoint("a", r, 0, 10 + r, f"/x/a{r}.sock", 1.0) for r in range(3)]
    monkeypatch.setattr("tui.stream.discovery.list_endpoints", lambda directory=None: eps)
    app = build_app(None)
    assert isinstance(app.feed, LiveFeed) and app.feed.job == "a" and len(app.feed._initial) == 3


@pytest.mark.slow
def test_cli_without_a_terminal_is_one_line_not_a_traceback(recordings):
    out = subprocess.run([sys.executable, "-m", "tui.cli", "attach", str(recordings["healthy"])],
                         capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=30)
    assert out.returncode == 2
    assert out.stderr.startswith("perfmon attach: needs a terminal") and "Traceback" not in out.stderr
    assert out.stderr.count("\n") == 1


def test_bad_speed_is_refused():
    with pytest.raises(UserError, match="--speed"):
        from tui.commands.attach import main
        main(SimpleNamespace(target=None, token=None, speed=0.0))


# -- layout -----------------------------------------------------------------------------------

def test_80x24_shows_four_panes_in_two_columns_led_by_the_verdict_pane():
    p = plan(80, 24, lead="memory", multi_rank=True)
    assert p.columns == 2 and len(p.visible) == 4 and "memory" in p.visible
    assert len(p.dropped) == 2


def test_120x36_shows_all_six_and_200_columns_use_three():
    assert len(plan(120, 36).visible) == 6 and plan(120, 36).columns == 2
    assert plan(200, 50).columns == 3 and len(plan(200, 50).visible) == 6


def test_narrow_terminal_stacks_panes_in_one_column():
    p = plan(60, 40, lead="comm")
    assert p.columns == 1 and len(p.visible) == 4 and "comm" in p.visible
    tiny = plan(60, 20, lead="comm")
    assert tiny.visible == ("comm",)


def test_user_toggles_win_over_priority():
    p = plan(80, 24, lead="data", hidden=frozenset({"data"}), shown=frozenset({"timeline"}))
    assert "data" not in p.visible and "timeline" in p.visible


# -- terminal loss ----------------------------------------------------------------------------

def test_a_hung_up_terminal_is_detected(monkeypatch):
    master, slave = pty.openpty()
    stream = os.fdopen(slave, "r")
    monkeypatch.setattr(sys, "__stdin__", stream)
    try:
        assert app_module.terminal_alive()
        os.close(master)   # what sshd does when the connection drops
        assert not app_module.terminal_alive()
    finally:
        stream.close()


def test_every_verdict_leads_with_a_pane_the_layout_knows_and_it_is_kept():
    from perfmon_analysis.verdict import CHART
    from tui.app.widgets.layout import PANE_ORDER

    panes = {o.pane for o in CHART.outcomes.values() if o.pane is not None}
    assert panes <= set(PANE_ORDER)
    for pane in panes:
        assert pane in plan(60, 20, lead=pane).visible       # room for one pane: the verdict's


def test_a_large_job_gives_the_ranks_heatmap_a_full_width_row_and_fills_whole_rows_above_it():
    small = plan(80, 24, lead="comm", multi_rank=True, many_ranks=True)
    assert small.wide == ("ranks",) and small.visible == ("comm", "data", "ranks")   # the lead, then by priority
    assert small.dropped == ("device", "memory", "timeline")
    big = plan(120, 36, lead="comm", multi_rank=True, many_ranks=True)
    assert big.wide == ("ranks",) and len(big.visible) == 5 and big.dropped == ("timeline",)
    one_column = plan(60, 40, lead="comm", multi_rank=True, many_ranks=True)
    assert one_column.wide == () and "ranks" in one_column.visible
    assert plan(120, 36, lead="comm", multi_rank=True).wide == ()
