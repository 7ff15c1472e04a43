"""``perfmon report --html``: one offline page from the run's history, with the verdict's changes.

The page drawing in a real browser is tests/integration/test_html_report.py."""

from __future__ import annotations

import html
import json
import re

import pytest

from perfmon_analysis.history import STEP_FIELDS
from tests.helpers import chromium
from tests.tui import scenarios
from tui import cli
from tui.stream.connect import load


def test_a_replayed_recording_keeps_the_verdict_change_at_its_time(tmp_path):
    rec = scenarios.write("trends", tmp_path, steps=2000)
    analysis, _ = load(str(rec), 5.0, verdicts=60)
    changes = list(analysis.history.verdicts)
    # healthy (the checkpoint before step 800 is a pause of 3 s in ~85 s: ETTR stays over 90%, over the run,
    # whether or not the window holds it); data loading from the middle
    assert [(c.bottleneck, c.severity) for c in changes] == [("healthy", "ok"), ("data_loading", "warn")]
    # the loader falls behind at step 1000: T0 + 1 + 100 + 3 + 2 s; judged every ~5 s of the ~270 s run
    assert 106 < changes[1].t - scenarios.T0 < 106 + 3 * 5
    trend = analysis.history.trend(50)
    data = STEP_FIELDS.index("data")
    assert trend[0].mean[data] < 0.01 < 0.05 < trend[-1].mean[data]  # type: ignore[operator]


def test_the_page_holds_its_script_and_fetches_nothing(tmp_path, capsys):
    page = tmp_path / "r.html"
    assert cli.main(["report", "--html", str(page), str(scenarios.write("trends", tmp_path, steps=600))]) == 0
    assert capsys.readouterr().out.startswith("perfmon report: gpt-trends")   # the text report still prints
    text = page.read_text()
    assert "BEGIN bokeh.min.js" in text                       # Bokeh itself, inline
    # no tag loads anything (Bokeh's own code names a MathJax CDN it would use only for math text, and
    # the browser test fails on any request that leaves the file)
    assert not re.search(r"<(script|link|img|iframe)\b[^>]*\b(src|href)\s*=", text)
    assert not re.search(r"@import|url\(\s*['\"]?https?:", text)
    assert "bokeh-widgets" not in text                        # only the core bundle
    assert "Verdict: " in text and "Step time over the run" in text
    # what fixing the data wait buys, as the text report words it (the speedup bound of its share)
    gains = re.search(r"<h2>What fixing it buys</h2><pre>(.*?)</pre>", text, re.S)
    assert gains and re.search(r"data wait\s+\d\.\d+×", html.unescape(gains.group(1))), text[:3000]
    # the scenario has no collectives: its map is named as not measured, not drawn as zeros
    assert "Not measured on any rank, so not drawn: exposed comm (share of the step)." in text
    # the two 2 s checkpoints before steps 240 and 480 (40% and 80% of 600) lead the longest pauses
    pauses = re.findall(r"<li>([^<]*) before a step of ([\d-]+) on rank \d+ \(n01\)([^,]*), ([^ ]+) into", text)
    assert [p[:2] for p in pauses[:2]] == [("2s", "240-243"), ("2s", "480-483")], pauses
    assert all(p[2] == " and 1 more" for p in pauses[:2]), pauses       # the other rank paused too
    # from the first step's end: step 240 ends 24 s of steps + the 3 s spike + its own 2 s later; step 480
    # 24 s more of steps, 180 of them 60 ms longer (the slow loader), and its 2 s
    into = [sum(int(n) * (60 if unit == "m" else 1) for n, unit in re.findall(r"(\d+)([ms])", p[3]))
            for p in pauses[:2]]
    assert abs(into[0] - 29.0) <= 1 and abs(into[1] - (29.0 + 24 + 180 * 0.06 + 2)) <= 1, pauses
    assert len(text) < 2_000_000


def test_an_unwritable_html_path_is_one_line_and_exit_2(tmp_path, capsys):
    rec = scenarios.write("healthy", tmp_path)
    assert cli.main(["report", "--html", str(tmp_path / "no" / "such" / "dir" / "r.html"), str(rec)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("perfmon report: --html ")


def test_the_page_carries_a_recorded_module_profile_and_capture(tmp_path, monkeypatch):
    def profiled_and_captured():
        ranks = scenarios.healthy()
        t = ranks[0][-1]["t"]
        ranks[0].append({"k": "profile", "t": t, "id": 1, "steps": 5, "first_step": 10, "last_step": 14, "depth": 1,
                         "step_s": 0.01, "timer": "perf_counter", "modules": [
                             {"name": "", "type": "ResNet", "depth": 0, "params": 10, "calls": 1.0, "fwd_s": 0.003,
                              "bwd_s": 0.005, "flops": 9e9, "fwd_flops": 3e9},
                             {"name": "layer2", "type": "Sequential", "depth": 1, "params": 5, "calls": 1.0,
                              "fwd_s": 0.002, "bwd_s": 0.004, "flops": 3e9, "fwd_flops": 1e9}]})
        ranks[1].append({"k": "capture", "t": t, "id": 2, "steps": 3, "first_step": 7, "last_step": 9, "wall_s": 0.3,
                         "path": "/runs/r1.capture-7.pt.trace.json.gz",
                         "top": [{"name": "aten::addmm", "self_s": 0.012, "calls": 30}], "gaps": []})
        return ranks

    monkeypatch.setitem(scenarios.SCENARIOS, "profiled_and_captured", profiled_and_captured)
    page = tmp_path / "r.html"
    assert cli.main(["report", "--html", str(page), str(scenarios.write("profiled_and_captured", tmp_path))]) == 0
    text = page.read_text()
    assert "<h2>Module profile</h2>" in text and "layer2" in text
    assert "<h2>torch.profiler captures</h2>" in text and "r1.capture-7.pt.trace.json.gz" in text
    assert "aten::addmm" in text
    plain = tmp_path / "plain.html"
    assert cli.main(["report", "--html", str(plain), str(scenarios.write("healthy", tmp_path))]) == 0
    assert "Module profile" not in plain.read_text() and "captures" not in plain.read_text()


@pytest.mark.slow     # runs the formatter's code in headless Chromium
@pytest.mark.skipif(chromium.executable() is None, reason="chromium not installed (.ci/run installs it)")
def test_a_heatmaps_hover_names_the_rank_and_node_of_the_row_under_the_pointer(tmp_path):
    """Rows are ranks grouped by node, so a row number is not a rank: the hover's formatter maps the
    pointer's row to its rank, run in the browser engine that runs it on the page."""
    from bokeh.models import CustomJSHover, HoverTool
    from bokeh.models.ranges import Range1d

    from tui.export import html as page

    analysis, _ = load(str(scenarios.write("many_nodes", tmp_path, nodes=3, per_node=2, slow_rank=4)), 5.0)
    figures, _ = page._heatmaps(analysis.history, Range1d(0, 1))
    hover = next(t for t in figures[0].tools if isinstance(t, HoverTool))
    assert ("rank", "$y{rank}") in hover.tooltips
    formatter = hover.formatters["$y"]
    assert isinstance(formatter, CustomJSHover)
    labels = formatter.args["labels"]
    assert labels == ["0 (n01)", "1 (n01)", "2 (n02)", "3 (n02)", "4 (n03)", "5 (n03)"]
    blank = tmp_path / "blank.html"
    blank.write_text("<!doctype html><title>formatter</title>")
    call = (f"(() => {{ const labels = {json.dumps(labels)};\n"
            f"const f = (value) => {{ {formatter.code} }};\n"
            "return [f(0.2), f(3.99), f(5.5), f(6.0), f(-0.1)]; })()")
    run = chromium.load(blank, "true", call)
    assert run.errors == []
    assert run.result == ["0 (n01)", "3 (n02)", "5 (n03)", "", ""]
