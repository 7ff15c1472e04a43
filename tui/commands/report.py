"""``perfmon report``: the verdict and its evidence as JSON (``tui/schemas/report.schema.json``)
or as 80-column text.

The report itself is ``perfmon_analysis.report`` (pure); this command only gathers the records
(recording files, or a live job for ``--seconds``, ``tui.stream.connect.load``) and prints.
Recording problems (torn tail, corruption) do not stop the report: what was intact is analysed
and each problem is one line on stderr.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from tui.errors import UserError
from tui.pricing import price_per_device_hour
from tui.stream.connect import load

VERDICT_INSTANTS = 60    # a recording's verdict is judged at this many instants for the HTML report's timeline


def _write_html(analysis: Any, report: dict[str, Any], path: str) -> None:
    from tui.export.html import render
    try:
        with open(path, "w", encoding="utf-8") as out:
            out.write(render(analysis, report))
    except OSError as exc:
        raise UserError(f"--html {path}: {exc.strerror or exc}") from None


def main(args: Any) -> int:
    """``perfmon report FILE|DIR|TARGET [--json] [--seconds S] [--html OUT.html] [--price-per-device-hour P]``."""
    price = price_per_device_hour(getattr(args, "price_per_device_hour", None))
    html_out = getattr(args, "html", None)
    analysis, source = load(args.target, float(getattr(args, "seconds", 5.0) or 5.0), args,
                            verdicts=VERDICT_INSTANTS if html_out else 0)
    live = source["kind"] != "recording"
    snapshot = analysis.snapshot(time.time() if live else None, clock=time.monotonic() if live else None)
    report = analysis.report(snapshot=snapshot, source=source, price=price)
    if not report["ranks"]:
        raise UserError(f"{args.target}: no records from any rank to report on")
    if html_out:
        _write_html(analysis, report, html_out)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        sys.stdout.write(analysis.text_report(snapshot, price=price))
    return 0
