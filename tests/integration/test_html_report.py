"""``perfmon report --html`` opened in a real headless Chromium: no console error, no request that
leaves the file, and every chart drawn (ink in each plot's frame, read back from its canvas)."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import chromium
from tests.tui import scenarios

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(chromium.executable() is None, reason="chromium not installed (.ci/run installs it)")]

PERFMON = [sys.executable, "-m", "tui.cli"]
ROOT = Path(__file__).resolve().parents[2]

READY = "window.Bokeh && Bokeh.documents.length > 0 && Bokeh.documents[0].is_idle"
# Legends and grid lines would count as ink in an empty plot: hide them before reading the canvases.
BARE = "for (const m of Bokeh.documents[0].all_models) if (['Legend', 'Grid'].includes(m.type)) m.visible = false"
# Each plot's title, its renderers, and the share of its frame's pixels that are not background.
PLOTS = """(() => {
  const plots = [];
  const walk = (v) => { if (v.model.type === 'Figure') plots.push(v); for (const c of (v.child_views || [])) walk(c); };
  for (const r of Bokeh.index.roots) walk(r);
  return plots.map(v => {
    const composed = v.canvas_view.compose();
    const canvas = composed.canvas || composed;
    const f = v.frame.bbox, k = window.devicePixelRatio || 1;
    const m = 3;   // inside the frame's edges, where the axes are drawn
    const px = canvas.getContext('2d').getImageData(Math.round((f.x + m) * k), Math.round((f.y + m) * k),
                                                    Math.round((f.width - 2 * m) * k),
                                                    Math.round((f.height - 2 * m) * k)).data;
    let ink = 0;
    for (let i = 0; i < px.length; i += 4)
      if (px[i + 3] > 0 && (px[i] < 235 || px[i + 1] < 235 || px[i + 2] < 235)) ink++;
    return {title: v.model.title.text, ink: ink / (px.length / 4)};
  });
})()"""


def _report_html(target: Path, out: Path) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(PERFMON + ["report", "--html", str(out), str(target)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _check_in_browser(page: Path, titles: list[str], prepare: str = BARE) -> list[dict]:
    """Load ``page``: no error, no outside request, exactly the charts ``titles`` (every chart the
    page draws, counted from the page itself), and ink in each."""
    run = chromium.load(page, READY, PLOTS, prepare)
    assert run.ready, "Bokeh never finished drawing"
    assert run.errors == []
    assert run.requests == []
    drawn = [(p["title"].split(" (")[0].split(";")[0], p["ink"]) for p in run.result]
    assert sorted(title for title, _ in drawn) == sorted(titles), drawn
    empty = [(title, ink) for title, ink in drawn if ink <= 0.005]
    assert not empty, f"nothing drawn in {empty} (share of the frame with ink)"
    return run.result


def test_a_simulated_two_rank_run_draws_every_chart_offline(tmp_path):
    page = tmp_path / "report.html"
    _report_html(scenarios.write("trends", tmp_path, steps=3000), page)
    _check_in_browser(page, ["Step time over the run", "Verdict over the run", "Per rank: step time",
                             "Per rank: compute", "Per rank: data wait", "Memory of rank 0 on n01"])


def test_a_real_two_rank_recording_draws_in_the_browser(tmp_path, load_imbalance_demo):
    run, rec = load_imbalance_demo      # perfmon demo --headless --scenario load_imbalance --record
    assert run.proc.returncode == 0, run.proc.stderr[-3000:]
    assert len(list(rec.glob("*.pmrec"))) == 2
    page = tmp_path / "report.html"
    _report_html(rec, page)
    _check_in_browser(page, ["Step time over the run", "Verdict over the run", "Per rank: step time",
                             "Per rank: compute", "Per rank: data wait", "Per rank: exposed comm",
                             f"Memory of rank 1 on {platform.node()}"])     # rank 1: 3x the batch


def test_a_simulated_1024_rank_recording_draws_in_the_browser(tmp_path):
    page = tmp_path / "report.html"
    _report_html(scenarios.write("trends", tmp_path, ranks=1024, steps=30), page)
    assert page.stat().st_size < 5_000_000
    _check_in_browser(page, ["Step time over the run", "Verdict over the run", "Per rank: step time",
                             "Per rank: compute", "Per rank: data wait", "Memory of rank 0 on n01"])


def test_the_browser_check_catches_an_error_a_request_a_blank_chart_and_a_chart_not_named(tmp_path):
    """The checks above are not vacuous: a planted console error, an outside request, a chart with
    no data and a chart the test does not name are each caught."""
    page = tmp_path / "report.html"
    _report_html(scenarios.write("trends", tmp_path, steps=400), page)
    text = page.read_text()
    planted = tmp_path / "planted.html"
    planted.write_text(text.replace("</body>", "<script>console.error('planted')</script>"
                                               "<img src=\"http://example.invalid/pixel.png\"></body>"))
    run = chromium.load(planted, READY, PLOTS)
    assert any("planted" in e for e in run.errors)
    assert any(r.startswith("http://example.invalid/") for r in run.requests)
    charts = ["Step time over the run", "Verdict over the run", "Per rank: step time", "Per rank: compute",
              "Per rank: data wait", "Memory of rank 0 on n01"]
    _check_in_browser(page, charts)
    with pytest.raises(AssertionError, match="Per rank: compute"):       # one chart left out of the list
        _check_in_browser(page, [c for c in charts if c != "Per rank: compute"])
    blank = BARE + ("; for (const m of Bokeh.documents[0].all_models) if (m.type === 'Figure' && "
                    "m.title.text.startsWith('Per rank: compute')) for (const r of m.renderers) r.visible = false")
    with pytest.raises(AssertionError, match=r"nothing drawn in \[\('Per rank: compute'"):
        _check_in_browser(page, charts, prepare=blank)
