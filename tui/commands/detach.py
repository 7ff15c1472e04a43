"""``perfmon detach PID``: take out of a process everything ``perfmon inject`` put in it.

The probe is closed (its last records sent), its hooks and wrapped functions are taken out,
its threads joined, its socket removed and its modules unloaded; the job goes on. A torchrun
launcher's PID stands for its workers here.
"""

from __future__ import annotations

from typing import Any

from tui.errors import UserError
from tui.injector import check, detach, workers


def main(args: Any) -> int:
    pid = int(args.pid)
    targets = [check(p) for p in workers(pid)]
    failed = []
    for target in targets:
        answer = detach(target)
        print(f"{target.pid}: {answer.get('message')}")
        if not answer.get("ok"):
            failed.append(f"{target.pid}: {answer.get('message')}")
    if failed:
        raise UserError("; ".join(failed))
    return 0
