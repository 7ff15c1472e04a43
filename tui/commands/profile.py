"""``perfmon profile TARGET``: time each module of a live job for a few steps.

Asks one rank's probe (a ``profile`` request) and follows that same connection while
it works, so the profile is judged against the rank's own steps before it (its overhead). The
table is ``perfmon_analysis.profile.profile_lines`` over the report's ``profile`` JSON, shared with
``perfmon report`` and the TUI's profile screen.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from perfmon_analysis.analysis import Analysis
from perfmon_analysis.profile import profile_lines
from tui.errors import UserError

DEFAULT_STEPS = 5
DEFAULT_DEPTH = 3


def main(args: Any) -> int:
    from tui.stream import discovery
    from tui.stream.connect import remote_feed
    from tui.stream.requests import Target, ask

    remote = remote_feed(args)
    if remote is not None:
        return _across_hosts(args, remote)
    host_port = discovery.parse_host_port(args.target) if args.target else None
    if host_port is not None:
        target = Target(host=host_port[0], port=host_port[1], token=discovery.read_token(args.token))
    else:
        endpoints = discovery.resolve_live(args.target)
        ranks = sorted(ep.rank for ep in endpoints)
        rank = ranks[0] if args.rank is None else args.rank
        chosen = [ep for ep in endpoints if ep.rank == rank]
        if not chosen:
            raise UserError(f"job {endpoints[0].job} has no rank {rank} here (ranks on this host: "
                            f"{', '.join(map(str, ranks))})")
        target = Target(path=chosen[0].socket, label=f"{chosen[0].job} rank {rank}")
    analysis = Analysis()
    stream = target.label
    print(f"profiling {target.label}: the next {args.steps} steps to depth {args.depth} ...", file=sys.stderr)
    ask(target, "profile", {"steps": args.steps, "depth": args.depth}, args.timeout, "profile",
        on_record=lambda record: analysis.ingest(stream, record))
    return _show(args, analysis.view().profile, target.label)


def _across_hosts(args: Any, feed: Any) -> int:
    """``--hosts``: the rank (``--rank``, else the lowest) asked through its node's relay, which
    sends its steps in full meanwhile, so the profile's cost is measured as on the node."""
    from tui.stream.remote import RemoteJob

    with RemoteJob(feed) as job:
        rows = job.ranks(None if args.rank is None else {args.rank}, args.timeout)
        if not rows:
            raise UserError(f"job {args.target} has no rank {args.rank} on those hosts")
        row = min(rows, key=lambda r: r.rank)
        job.follow({row.stream})
        target = job.target(row.stream)
        print(f"profiling {target.label}: the next {args.steps} steps to depth {args.depth} ...", file=sys.stderr)
        target.ask("profile", {"steps": args.steps, "depth": args.depth}, args.timeout, "profile")
        profile = job.view().profile
    return _show(args, profile, target.label)


def _show(args: Any, profile: Any, label: str) -> int:
    if profile is None:     # cannot happen once the record arrived; said rather than assumed
        raise UserError(f"{label}: the profile record could not be read")
    data = profile.as_json()
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        sys.stdout.write("\n".join(profile_lines(data, top=args.top)) + "\n")
    return 0 if not profile.error else 1
