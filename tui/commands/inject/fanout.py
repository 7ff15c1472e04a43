"""What ``perfmon inject`` and ``perfmon detach`` share: the processes they act on here, and the
same command run on every host of a job through the relays' transport (``tui.stream.hosts``),
with each host's answer printed under its name."""

from __future__ import annotations

import sys
from typing import Any

from tui.errors import UserError
from tui.injector import ANSWER_SECONDS, ENTER_SECONDS
from tui.processes import job_processes, workers


def chosen(args: Any) -> list[int]:
    """The processes ``perfmon inject`` / ``detach`` act on here: ``--job NAME``'s, else the PID's
    (a torchrun launcher's workers)."""
    if (args.pid is None) == (args.job is None):
        raise UserError("give a PID or --job NAME (one of them)")
    return job_processes(args.job) if args.job is not None else workers(args.pid)


def across_hosts(args: Any) -> tuple[list[str], str] | None:
    """The hosts ``--hosts``/``--hostfile``/``--slurm``/``--k8s`` name and the transport to them,
    for a job across nodes; None when none is named (this node)."""
    from tui.stream import hosts

    found = hosts.choose_hosts(args.hosts, args.hostfile, args.slurm, args.k8s, args.namespace)
    if found is None:
        if args.via is not None:
            raise UserError("--via goes with --hosts, --hostfile, --slurm or --k8s")
        return None
    if args.pid is not None or args.job is None:
        raise UserError("a PID is a process of one node: name the job on those hosts with --job NAME")
    return found, hosts.transport(args.via, args.k8s, args.namespace)


def on_hosts(action: str, job: str, found: list[str], via: str, timeout: float, method: str = "auto") -> list[Any]:
    """``perfmon ACTION --job JOB`` on every host at once through the transport (``tui.stream.hosts``);
    each host's ``HostRun``."""
    from tui.stream.hosts import run_on_hosts

    command = ["perfmon", action, "--job", job]
    if action == "inject":
        command[2:2] = ["--timeout", f"{timeout:g}"]
    if method != "auto":
        command[2:2] = ["--method", method]
    return run_on_hosts(found, via, command, timeout + max(ENTER_SECONDS, timeout) + max(ANSWER_SECONDS, timeout))


def relay_output(action: str, results: list[Any]) -> None:
    """What the hosts said, line by line under each host's name (their ``perfmon ACTION: `` taken off)."""
    for result in results:
        for line in result.out.splitlines():
            print(f"{result.host}: {line}", flush=True)
        for line in result.err.splitlines():
            print(f"perfmon {action}: {result.host}: {line.removeprefix(f'perfmon {action}: ')}", file=sys.stderr,
                  flush=True)


def host_failures(action: str, results: list[Any]) -> str:
    """One line naming each host that failed and why ('' when none did)."""
    return "; ".join(f"{r.host}: {r.problem().removeprefix(f'perfmon {action}: ')}" for r in results if r.code != 0)
