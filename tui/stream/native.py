"""The stack of a process whose own threads cannot run (holding the GIL in C code, stopped), read
from outside by ``py-spy dump --nonblocking`` when py-spy is installed: the probe's stall watch
cannot report it, py-spy can. Offered by the stuck screen, never required. (py-spy refuses
``--native`` with ``--nonblocking``, and pausing a rank of a live job is not ours to do.)"""

from __future__ import annotations

import shutil
import subprocess

TIMEOUT_S = 15.0


def available() -> bool:
    return shutil.which("py-spy") is not None


def dump(pid: int) -> str:
    """py-spy's dump of ``pid``'s Python threads, or one line saying why there is none."""
    exe = shutil.which("py-spy")
    if exe is None:
        return "py-spy is not installed (pip install py-spy) to read a stack from outside the process"
    try:
        out = subprocess.run([exe, "dump", "--nonblocking", "--pid", str(pid)], capture_output=True,
                             text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"py-spy dump --pid {pid} did not finish in {TIMEOUT_S:.0f}s"
    except OSError as exc:
        return f"py-spy could not run: {exc.strerror or exc}"
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or [f"exit status {out.returncode}"])[-1]
        return f"py-spy dump --pid {pid}: {last} (another user's process, or ptrace not allowed?)"
    return out.stdout.rstrip()
