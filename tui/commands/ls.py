"""``perfmon ls``: the live jobs of this user on this node, as a table or JSON."""

from __future__ import annotations

import json
from typing import Any

from probe import paths
from tui.stream.discovery import list_endpoints


def main(args: Any) -> int:
    endpoints = list_endpoints()
    if args.json:
        print(json.dumps([ep.as_json() for ep in endpoints], indent=2))
        return 0
    if not endpoints:
        print(f"no perfmon jobs running for this user ({paths.socket_dir()})")
        return 0
    print(f"{'JOB':<24} {'RANK':>4} {'RESTART':>7} {'PID':>8} {'AGE':>8}  SOCKET")
    for ep in endpoints:
        print(f"{ep.job[:24]:<24} {ep.rank:>4} {ep.restart:>7} {ep.pid:>8} {_age(ep.age_s):>8}  {ep.socket}")
    return 0


def _age(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"
