"""``perfmon capture TARGET``: torch.profiler over the next N steps of a live job, on demand.

Each rank asked (``--ranks``, default all on this host) starts the profiler at a step boundary,
writes a gzip Chrome trace beside its recording and answers with a summary (``probe.capture``).
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tui.errors import UserError
from tui.model.capture import capture_reading


def main(args: Any) -> int:
    from tui.stream import discovery
    from tui.stream.requests import Target, ask

    endpoints = discovery.resolve_live(args.target)
    wanted = _ranks(args.ranks)
    chosen = [ep for ep in endpoints if wanted is None or ep.rank in wanted]
    if not chosen:
        raise UserError(f"job {endpoints[0].job} has none of ranks {args.ranks} on this host "
                        f"(here: {', '.join(str(ep.rank) for ep in endpoints)})")
    print(f"capturing the next {args.steps} steps of {len(chosen)} rank(s) of {chosen[0].job} ...", file=sys.stderr)

    def one(ep: Any) -> dict[str, Any] | str:
        try:
            return ask(Target(path=ep.socket, label=f"rank {ep.rank}"), "capture", {"steps": args.steps},
                       args.timeout, "capture")
        except UserError as exc:
            return str(exc)

    with ThreadPoolExecutor(max_workers=min(16, len(chosen))) as pool:
        results = list(pool.map(one, chosen))
    failed = [r for r in results if isinstance(r, str)]
    done = [capture_reading(r, ep.rank) for ep, r in zip(chosen, results) if not isinstance(r, str)]
    if args.json:
        print(json.dumps({"captures": [c.as_json() for c in done], "errors": failed}, indent=2))
    else:
        for c in done:
            print("\n".join(c.lines(200)))
    for line in failed:
        print(f"perfmon capture: {line}", file=sys.stderr)
    return 0 if done and not failed and not any(c.error for c in done) else (1 if done else 2)


def _ranks(text: str | None) -> set[int] | None:
    if not text:
        return None
    try:
        return {int(part) for part in text.split(",") if part.strip()}
    except ValueError:
        raise UserError(f"--ranks {text}: expected a comma-separated list of rank numbers") from None
