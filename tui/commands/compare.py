"""``perfmon compare BASELINE CANDIDATE``: two runs side by side with a noise-aware decision on the
step time, what moved, and exit 1 past a limit (for CI).

The comparison is ``perfmon_analysis.compare`` (pure); this command loads each side as
``perfmon report`` does (recordings, directories or a live job for ``--seconds``,
``tui.stream.connect.load``), with a window over the whole run, and prints.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from perfmon_analysis.compare import compare, parse_limits, render_text, whole_run
from tui.errors import UserError
from tui.stream.connect import load


def main(args: Any) -> int:
    """0: within the limits (or none given); 1: a limit passed; 2: bad input (``UserError``)."""
    if args.max_regression is not None and args.max_regression < 0:
        raise UserError(f"--max-regression {args.max_regression}: must be 0 or more (percent)")
    if args.warmup < 0:
        raise UserError(f"--warmup {args.warmup}: must be 0 or more (steps)")
    if args.min_change < 0:
        raise UserError(f"--min-change {args.min_change}: must be 0 or more (percent)")
    try:
        limits = parse_limits(args.limit or [])
    except ValueError as exc:
        raise UserError(str(exc)) from None
    sides = []
    for target in (args.baseline, args.candidate):
        analysis, source = load(target, args.seconds, prog="perfmon compare", analysis=whole_run())
        if not analysis.view().ranks:
            raise UserError(f"{target}: no records from any rank to compare")
        sides.append((analysis, source))
    result = compare(sides[0][0], sides[1][0], min_change=args.min_change / 100, warmup=args.warmup,
                     max_regression=None if args.max_regression is None else args.max_regression / 100,
                     limits=limits, sources=(sides[0][1], sides[1][1]))
    for check in result["limits"]:
        if check["status"] == "unknown":
            print(f"perfmon compare: limit on {check['metric']} not checked: {check['why']}", file=sys.stderr)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        sys.stdout.write(render_text(result))
    return 1 if result["over_limit"] else 0
