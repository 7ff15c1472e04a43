"""``perfmon inject PID [--timeout S] [--attach]``: start the probe inside a job that runs without it.

PID is a training process, or a torchrun launcher (each worker on this node is entered). The
command returns once every probe's socket is up, which is at the first optimizer step after
the injection; ``--attach`` then opens the TUI on the job and, on leaving it, asks whether to
detach. How it enters a process and what it leaves there: ``tui.injector``, docs/attach.md.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from tui.errors import UserError
from tui.injector import POLL, Target, check, detach, run, workers
from tui.stream import discovery


def _say(message: str) -> None:
    print(f"perfmon inject: {message}", file=sys.stderr, flush=True)


def wait_for_sockets(pids: list[int], timeout: float) -> list[discovery.Endpoint]:
    """The probes' endpoints once each of ``pids`` serves one; UserError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        found = {ep.pid: ep for ep in discovery.list_endpoints() if ep.pid in pids}
        if len(found) == len(pids):
            return [found[pid] for pid in pids]
        missing = [pid for pid in pids if pid not in found]
        gone = [pid for pid in missing if not os.path.exists(f"/proc/{pid}")]
        if gone:
            raise UserError(f"{', '.join(map(str, gone))} exited before its probe came up")
        if time.monotonic() > deadline:
            raise UserError(f"no training step in {', '.join(map(str, missing))} within {timeout:g} s: the hooks "
                            "are in place and the probe starts at the next optimizer step; "
                            f"`perfmon detach {missing[0]}` removes them")
        time.sleep(POLL)


def main(args: Any) -> int:
    pid = int(args.pid)
    pids = workers(pid)
    targets: list[Target] = [check(p) for p in pids]   # every refusal before any process is entered
    entered: list[Target] = []
    for target in targets:
        answer = run(target, "inject")
        if not answer.get("ok"):
            for done in entered:     # all ranks or none
                detach(done)
            raise UserError(f"{target.pid}: {answer.get('message')}")
        entered.append(target)
        _say(f"{target.pid}: {answer.get('message')}")
    endpoints = wait_for_sockets(pids, args.timeout)
    job = endpoints[0].job
    for ep in endpoints:
        print(f"injected {ep.pid}: job {ep.job} rank {ep.rank} ({ep.socket})")
    if not args.attach:
        print(f"watch it: perfmon attach {job}; remove it: perfmon detach {pid}")
        return 0
    from perfmon_analysis.analysis import Analysis
    from tui.app.launch import app_for, needs_terminal, run_app
    from tui.stream.feed import LiveFeed

    needs_terminal()
    code = run_app(app_for(LiveFeed(Analysis().model, job, endpoints)))
    try:
        reply = input(f"detach perfmon from {pid}? [Y/n] ").strip().lower()
    except EOFError:
        reply = "n"
    if reply in ("", "y", "yes"):
        for target in entered:
            answer = detach(target)
            print(f"{target.pid}: {answer.get('message')}")
    return code
