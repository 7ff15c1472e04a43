"""``perfmon doctor``: does perfmon tell the truth on this machine?

Short workloads plant a known truth, measure it with a clock the probe does not use, and run
under the probe; the table compares the two (check, expected, measured, verdict). Exit status 1
when any check disagrees, 0 otherwise (checks that cannot run here say why and do not fail).

On every machine (``checks.cpu_checks``): a compute-bound loop (healthy, its CPU busy against the
training thread's CPU clock and run-queue wait), a loader sleeping a known share of each step
(that data wait, ± 5 points), a loader starving the loop (``data_loading``) and known time
between steps (ETTR ± 0.05).
With a CUDA GPU (``gpu.gpu_checks``): perfmon's own step timer against the host clock across a
synchronize, kernels back to back (busy in time, not starved), NVML's utilization against the planted
kernel share of a GPU idle half of each step and the verdict on it (``host_overhead`` with the host's
lead measured and short), GPM's SM fill against full and one-block kernels and the verdict on the
narrow loop (``low_fill``), a sync every step (``host_sync``), a sync on a device that never idles (not
``host_sync``), tiny kernels (``host_overhead``), a hybrid model (a CUDA job with its host share) and a
CPU model on the GPU host (a CPU verdict). Every row can fail on a perfmon error, and none passes on
another's evidence; a row whose reading the driver cannot give (asked of NVML directly) does not run.
The GPU workloads reach the device through a ``Device``, so the tests run them on the simulated
device layer.
"""

from __future__ import annotations

import argparse
import shutil

from tui.commands.doctor.checks import cpu_checks
from tui.commands.doctor.gpu import gpu_checks
from tui.commands.doctor.table import Check, render
from tui.commands.doctor.workloads import Device, TorchCudaDevice, why_no_gpu

__all__ = ["Check", "Device", "main", "render", "run_checks"]


def run_checks(device: Device | None, why_not: str = "not run: --cpu-only") -> list[Check]:
    return cpu_checks() + gpu_checks(device, why_not)


def main(args: argparse.Namespace) -> int:
    try:
        import torch  # noqa: F401  (the workloads train small models)
    except ImportError:
        from tui.errors import UserError
        raise UserError("needs torch: pip install 'perfmon[torch]' (or any torch build)") from None
    why_not = why_no_gpu()
    device = TorchCudaDevice() if not args.cpu_only and why_not is None else None
    print(f"perfmon doctor: {'GPU ' + device.name if device else 'CPU only'}; each check plants a known "
          "truth and compares perfmon's measurement with it", flush=True)
    checks = run_checks(device, "not run: --cpu-only" if args.cpu_only else why_not or "")
    print(render(checks, shutil.get_terminal_size((120, 24)).columns))
    return 1 if any(c.ok is False for c in checks) else 0
