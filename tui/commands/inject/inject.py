"""``perfmon inject PID|--job NAME [--hosts ...] [--timeout S] [--method M] [--attach]``: start
the probe inside a job that runs without it.

PID is a training process, or a torchrun launcher (each worker on this node is entered); ``--job
NAME`` finds the job's processes on this node by the name perfmon would give it, or, with
``--hosts``/``--slurm``/``--k8s``, runs ``perfmon inject --job NAME`` on every host through the
transport the relays use. All processes or none: when one refuses, those already entered are
detached. The command returns once every probe's socket is up, which is at the first optimizer
step after the injection (``--timeout`` bounds that wait, entering through ptrace (at least 10 s),
the injected code's answer once it has loaded the probe (at least 15 s: a loaded host imports
slowly), and, entering through ``sys.remote_exec``, the wait for the main thread to reach a safe
point); ``--attach`` then opens the TUI on the job and, on leaving it, asks whether to detach. How it enters a process
(``--method``) and what it leaves there: ``tui.injector``, docs/attach.md.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from probe.paths import safe_job
from tui.commands.inject.fanout import across_hosts, chosen, host_failures, on_hosts, relay_output
from tui.errors import UserError
from tui.injector import ANSWER_SECONDS, ENTER_SECONDS, POLL, Target, check, detach, run
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


def _ask_detach(what: str) -> bool:
    try:
        reply = input(f"detach perfmon from {what}? [Y/n] ").strip().lower()
    except EOFError:
        return False
    return reply in ("", "y", "yes")


def _here(args: Any) -> int:
    job = safe_job(args.job) if args.job is not None else None
    targets: list[Target] = [check(p, args.method) for p in chosen(args)]   # every refusal before any is entered
    entered: list[Target] = []
    for target in targets:
        answer = run(target, "inject", timeout=max(ANSWER_SECONDS, args.timeout), job=job, reach=args.timeout,
                     enter=max(ENTER_SECONDS, args.timeout))
        if not answer.get("ok"):
            for done in entered:     # all ranks or none
                detach(done)
            raise UserError(f"{target.pid}: {answer.get('message')}")
        entered.append(target)
        _say(f"{target.pid}: {answer.get('message')}")
    pids = [t.pid for t in targets]
    endpoints = wait_for_sockets(pids, args.timeout)
    for ep in endpoints:
        print(f"injected {ep.pid}: job {ep.job} rank {ep.rank} ({ep.socket})", flush=True)
    remove = f"--job {job}" if job is not None else str(args.pid)
    if not args.attach:
        print(f"watch it: perfmon attach {endpoints[0].job}; remove it: perfmon detach {remove}")
        return 0
    from perfmon_analysis.analysis import Analysis
    from tui.app.launch import app_for, needs_terminal, run_app
    from tui.stream.feed import LiveFeed

    needs_terminal()
    code = run_app(app_for(LiveFeed(Analysis(), endpoints[0].job, endpoints)))
    if _ask_detach(remove.removeprefix("--job ")):
        for target in entered:
            print(f"{target.pid}: {detach(target).get('message')}")
    return code


def _everywhere(args: Any, found: list[str], via: str) -> int:
    job = safe_job(args.job)
    results = on_hosts("inject", job, found, via, args.timeout, args.method)
    failed = host_failures("inject", results)
    if failed:
        injected = [r.host for r in results if r.code == 0]
        if injected:      # all hosts or none
            left = [r.host for r in on_hosts("detach", job, injected, via, args.timeout, args.method) if r.code != 0]
            failed += f"; still injected on {', '.join(left)}" if left else f"; undone on {', '.join(injected)}"
        raise UserError(failed)
    relay_output("inject", results)
    hosts_flag = f"--hosts {args.hosts or ','.join(found)}"
    if not args.attach:
        print(f"watch it: perfmon attach {job} {hosts_flag}; remove it: perfmon detach --job {job} {hosts_flag}")
        return 0
    from perfmon_analysis.analysis import Analysis
    from tui.app.launch import app_for, needs_terminal, run_app
    from tui.stream.remote import RelayFeed

    needs_terminal()
    code = run_app(app_for(RelayFeed(Analysis(), job, found, via)))
    if _ask_detach(f"job {job} on {len(found)} host{'s' * (len(found) != 1)}"):
        results = on_hosts("detach", job, found, via, args.timeout, args.method)
        relay_output("detach", [r for r in results if r.code == 0])
        if host_failures("detach", results):
            raise UserError(host_failures("detach", results))
    return code


def main(args: Any) -> int:
    where = across_hosts(args)
    return _here(args) if where is None else _everywhere(args, *where)
