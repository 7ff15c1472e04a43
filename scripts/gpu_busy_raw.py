"""The GPU's busy readings with no perfmon in between: NVML utilization and GPM SM activity read with
pynvml directly while bf16 matmuls run back to back, then while they run half of the time. What
`perfmon doctor`'s busy checks compare against, measured independently (scripts/gpu_check.sh).

    python scripts/gpu_busy_raw.py
"""

from __future__ import annotations

import time

import pynvml
import torch


def gpm_sm_active(handle, seconds: float, work) -> tuple[float | None, float]:
    """(GPM SM activity, NVML utilization) over ``seconds`` of ``work()`` calls."""
    s1, s2 = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    pynvml.nvmlGpmSampleGet(handle, s1)
    utils = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        work()
        utils.append(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    torch.cuda.synchronize()
    pynvml.nvmlGpmSampleGet(handle, s2)
    mg = pynvml.c_nvmlGpmMetricsGet_t()
    mg.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    mg.numMetrics = 1
    mg.sample1, mg.sample2 = s1, s2
    mg.metrics[0].metricId = pynvml.NVML_GPM_METRIC_SM_UTIL
    pynvml.nvmlGpmMetricsGet(mg)
    sm = mg.metrics[0].value / 100 if mg.metrics[0].nvmlReturn == 0 else None
    return sm, sum(utils) / len(utils) / 100


def main() -> None:
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn_like(a)
    out = torch.empty_like(a)

    def matmuls(n: int) -> None:
        for _ in range(n):
            torch.matmul(a, b, out=out)

    matmuls(2000)                                          # clocks up
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    matmuls(200)
    torch.cuda.synchronize()
    per = (time.perf_counter() - t0) / 200
    print(f"one 4096^3 bf16 matmul: {per * 1e3:.3f} ms ({2 * 4096 ** 3 / per / 1e12:.0f} TFLOP/s)")

    def back_to_back() -> None:
        matmuls(50)
        torch.cuda.synchronize()

    def half() -> None:
        matmuls(max(1, round(0.010 / per)))
        torch.cuda.synchronize()
        end = time.perf_counter() + 0.010
        while time.perf_counter() < end:
            pass

    for name, work in (("back to back", back_to_back), ("half idle (10 ms on, 10 ms off)", half)):
        sm, util = gpm_sm_active(handle, 2.0, work)
        print(f"{name}: GPM SM activity {sm if sm is None else f'{sm:.0%}'}, NVML utilization {util:.0%}")


if __name__ == "__main__":
    main()
