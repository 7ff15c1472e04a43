"""Render the TUI against recordings to SVG (and PNG when rsvg-convert is installed).

    python scripts/screenshots.py                      # the test recordings (tests/tui/scenarios.py)
    python scripts/screenshots.py --recording NAME=DIR  # also a real recording (perfmon demo --record DIR)

Writes ``screenshots/<name>-<W>x<H>.svg`` (+ ``.png``) at 120x36 and 80x24, plus
the flowchart screen and, for a stuck job, the stacks screen; for a recording that holds a module
profile or a profiler capture, the ``m`` or ``c`` screen; for the ``trends`` and ``many_nodes``
scenarios and each ``--recording``, the trends screen (``t``) and ``perfmon report --html`` as the headless Chromium
draws it (``report-<name>.png``; needs Debian's ``chromium``). A recording is replayed to its end at once and the clock
is the recording's own, so the pictures are the same on every run.
PNG needs ``rsvg-convert`` (Debian: librsvg2-bin) and a monospace font with box
characters (fonts-firacode): the SVG itself is what Textual exports.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.tui import scenarios  # noqa: E402

SIZES = ((120, 36), (80, 24))


TREND_VERDICTS = 40      # instants a replay is judged at on the way, for the trends screen's verdict strip
HTML_SCENARIOS = ("trends", "many_nodes")   # test recordings also shown as the trends screen and HTML page


async def render(recording: Path, size: tuple[int, int], press: tuple[str, ...] = (), verdicts: int = 0) -> str:
    """The SVG of the app replaying ``recording`` at ``size`` once the verdict has settled."""
    app = scenarios.replay_app(recording, verdicts=verdicts)
    async with app.run_test(size=size) as pilot:
        await scenarios.settle(pilot)
        for key in press:
            await pilot.press(key)
        await pilot.pause()
        return app.export_screenshot(title="perfmon")


def to_png(svg: Path) -> Path | None:
    tool = shutil.which("rsvg-convert")
    if tool is None:
        return None
    png = svg.with_suffix(".png")
    # Textual writes spaces as &#160; inside <text>; librsvg drops leading ones unless told to keep them.
    fixed = svg.read_text(encoding="utf-8").replace("<svg ", '<svg xml:space="preserve" ', 1)
    with tempfile.NamedTemporaryFile("w", suffix=".svg", encoding="utf-8", delete=False) as tmp:
        tmp.write(fixed)
    try:
        subprocess.run([tool, "-z", "1.5", tmp.name, "-o", str(png)], check=True)
    finally:
        Path(tmp.name).unlink()
    return png


def html_report(recording: Path, png: Path) -> Path | None:
    """``perfmon report --html`` of ``recording``, screenshot by headless Chromium (None without it)."""
    browser = shutil.which("chromium")
    if browser is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "report.html"
        subprocess.run([sys.executable, "-m", "tui.cli", "report", "--html", str(page), str(recording)], cwd=ROOT,
                       check=True, stdout=subprocess.DEVNULL)
        subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        "--window-size=1200,1400", "--virtual-time-budget=10000", f"--screenshot={png.resolve()}",
                        page.as_uri()], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       cwd=tmp)
    return png


def _kinds(recording: Path) -> set[str]:
    from tui.stream.sources import load_recordings
    return {r["k"] for rec in load_recordings(recording) for r in rec.records}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "screenshots")
    parser.add_argument("--recording", action="append", default=[], metavar="NAME=DIR",
                        help="also render this recording (file or directory) under NAME")
    parser.add_argument("--only-recordings", action="store_true", help="skip the test recordings")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    jobs: list[tuple[str, Path]] = []
    with tempfile.TemporaryDirectory() as tmp:
        if not args.only_recordings:
            for name in scenarios.SCENARIOS:
                jobs.append((name, scenarios.write(name, Path(tmp))))
        scenario_jobs = list(jobs)
        for spec in args.recording:
            name, sep, path = spec.partition("=")
            if not sep:
                parser.error(f"--recording {spec}: expected NAME=DIR")
            jobs.append((name, Path(path)))
        written: list[Path] = []
        for name, recording in jobs:
            for width, height in SIZES:
                svg = args.out / f"{name}-{width}x{height}.svg"
                svg.write_text(asyncio.run(render(recording, (width, height))), encoding="utf-8")
                written.append(svg)
        first_name, first = jobs[0]
        svg = args.out / f"flowchart-{first_name}-120x36.svg"
        svg.write_text(asyncio.run(render(first, (120, 36), press=("f",))), encoding="utf-8")
        written.append(svg)
        for name, recording in jobs:
            if "stuck" in name:        # the stuck screen: each rank's part and stack (key s)
                svg = args.out / f"stacks-{name}-120x36.svg"
                svg.write_text(asyncio.run(render(recording, (120, 36), press=("s",))), encoding="utf-8")
                written.append(svg)
            kinds = _kinds(recording)
            for kind, key, prefix in (("profile", "m", "modules"), ("capture", "c", "capture")):
                if kind in kinds:      # the module profile (m) or capture (c) screen of a recording holding one
                    svg = args.out / f"{prefix}-{name}-120x36.svg"
                    svg.write_text(asyncio.run(render(recording, (120, 36), press=(key,))), encoding="utf-8")
                    written.append(svg)
            if name in HTML_SCENARIOS or (name, recording) not in scenario_jobs:
                for width, height in SIZES:     # the trends screen (t)
                    svg = args.out / f"trends-{name}-{width}x{height}.svg"
                    svg.write_text(asyncio.run(render(recording, (width, height), press=("t",),
                                                      verdicts=TREND_VERDICTS)), encoding="utf-8")
                    written.append(svg)
                shot = html_report(recording, args.out / f"report-{name}.png")
                print(shot.relative_to(ROOT) if shot and shot.is_relative_to(ROOT) else shot or
                      f"report-{name}.png: no chromium, skipped")
    for svg in written:
        png = to_png(svg)
        print(svg.relative_to(ROOT) if svg.is_relative_to(ROOT) else svg,
              "(+ png)" if png else "(no rsvg-convert: SVG only)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
