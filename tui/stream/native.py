"""Native stacks of a process that runs no Python (holding the GIL in C code, stopped), through
``py-spy dump --nonblocking`` when py-spy is installed. Offered by the stuck screen, never
required: perfmon's own stall records carry the Python stacks."""

from __future__ import annotations

import shutil
import subprocess

TIMEOUT_S = 15.0


def available() -> bool:
    return shutil.which("py-spy") is not None


def dump(pid: int) -> str:
    """py-spy's dump of ``pid`` (native frames included), or one line saying why there is none."""
    exe = shutil.which("py-spy")
    if exe is None:
        return "py-spy is not installed (pip install py-spy) for native stacks"
    try:
        out = subprocess.run([exe, "dump", "--nonblocking", "--native", "--pid", str(pid)], capture_output=True,
                             text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"py-spy dump --pid {pid} did not finish in {TIMEOUT_S:.0f}s"
    except OSError as exc:
        return f"py-spy could not run: {exc.strerror or exc}"
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or [f"exit status {out.returncode}"])[-1]
        return f"py-spy dump --pid {pid}: {last} (another user's process, or ptrace not allowed?)"
    return out.stdout.rstrip()
