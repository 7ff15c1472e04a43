"""``perfmon detach PID|--job NAME [--hosts ...]``: take out of a process everything ``perfmon
inject`` put in it.

The probe is closed (its last records sent), its hooks and wrapped functions are taken out,
its threads joined, its socket removed and its modules unloaded; the job goes on. A torchrun
launcher's PID stands for its workers here; ``--job NAME`` for the job's processes here, or,
with ``--hosts``/``--slurm``/``--k8s``, on every host (``perfmon detach --job NAME`` run there).
"""

from __future__ import annotations

from typing import Any

from probe.paths import safe_job
from tui.commands.inject.fanout import across_hosts, chosen, host_failures, on_hosts, relay_output
from tui.errors import UserError
from tui.injector import check, detach

HOST_SECONDS = 30.0


def main(args: Any) -> int:
    where = across_hosts(args)
    if where is not None:
        results = on_hosts("detach", safe_job(args.job), *where, HOST_SECONDS, args.method)
        relay_output("detach", [r for r in results if r.code == 0])
        if host_failures("detach", results):
            raise UserError(host_failures("detach", results))
        return 0
    targets = [check(p, args.method) for p in chosen(args)]
    failed = []
    for target in targets:
        answer = detach(target)
        print(f"{target.pid}: {answer.get('message')}")
        if not answer.get("ok"):
            failed.append(f"{target.pid}: {answer.get('message')}")
    if failed:
        raise UserError("; ".join(failed))
    return 0
