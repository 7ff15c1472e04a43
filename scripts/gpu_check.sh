#!/usr/bin/env bash
# What perfmon checks on a machine with a CUDA GPU, in one run (README, "GPU: what is verified").
#
#   bash scripts/gpu_check.sh [OUT_DIR]
#
# 1. the machine: GPU, driver, torch, Python
# 2. the GPU's busy readings straight from NVML (scripts/gpu_busy_raw.py), then perfmon doctor: the
#    planted-truth checks (CPU, then perfmon's step timer against the host clock, kernels back to back,
#    NVML utilization and the verdict on a half-idle GPU, GPM fill of full and one-block kernels and a
#    poorly filled GPU-bound loop (low_fill), a sync per step, a sync on a device that never idles (not
#    host_sync), launch-bound kernels, a hybrid model (CPU embedding, GPU layers: a CUDA job with its
#    host share), a CPU job on the GPU host)
# 2b. perfmon's own cost on ~5 ms GPU steps with a .item() each: no probe, CUDA events on every step,
#    events on one step per 0.1 s, alternated (bench/bench_gpu_step_cost.py --cuda; target under 0.5%)
# 3. perfmon demo --headless on the GPU: real jobs through `perfmon run`'s path, the verdict and
#    the device pane's numbers in the report JSON (healthy, host_sync, data_loading)
# 4. python -m pytest -m gpu: the compatibility matrix's GPU cells
# 5. the fast tier (-m "not slow") on a machine that has a GPU: no test may assume there is none
#
# Each step is bounded in time; logs go to OUT_DIR (default ./gpu-check); the last lines are a table.
# ONLY="doctor demo_healthy" runs just those steps (names as in the table).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-gpu-check}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 COLUMNS=200
declare -a summary

step() {  # step NAME SECONDS CMD...: run CMD under a time limit, log to $out/NAME.log, note its exit code
    local name="$1" limit="$2"; shift 2
    if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then return; fi
    local t0=$SECONDS
    echo "=== $name (limit ${limit}s): $*"
    timeout -k 5 "$limit" bash -c '"$@"' "$name" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    tail -n 40 "$out/$name.log"
    summary+=("$(printf '%-22s rc=%-4s %4ss' "$name" "$rc" "$((SECONDS - t0))")")
}

machine() {
    nvidia-smi --query-gpu=name,uuid,driver_version,memory.total,compute_cap --format=csv
    nvidia-smi -L
    python3 -c 'import sys, torch; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda,
"available", torch.cuda.is_available(), "devices", torch.cuda.device_count())'
    python3 -c 'import pynvml; pynvml.nvmlInit(); print("NVML", pynvml.nvmlSystemGetNVMLVersion(),
"driver", pynvml.nvmlSystemGetDriverVersion())'
}

demo() {  # demo SCENARIO: a headless demo run on the GPU, its report JSON kept
    perfmon demo --headless --scenario "$1" --seconds "${DEMO_S:-20}" >"$out/demo_$1.json" &&
    python3 - "$out/demo_$1.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
v, m = r["verdict"], r["metrics"]
print("verdict:", v["bottleneck"], "|", v["headline"])
print("device:", r["device"], "| window:", r["window"])
for k in ("step_time_median_s", "device_busy", "device_busy_source", "gpu_util", "device_fill", "sm_active",
          "device_idle_frac", "syncs_per_step", "data_wait_frac", "host_lead_s", "host_lead_steps",
          "device_time_median_s", "device_busy_unknown", "params_offloaded", "mfu", "peak_flops", "peak_source",
          "memory_headroom", "memory", "overhead_step_frac", "overhead_cpu_frac"):
    print(f"  {k} = {m.get(k)}")
print("  unknown:", v.get("unknown"), "| problems:", r.get("problems"))
EOF
}

export out
export -f machine demo
step machine 60 machine
if [ -d .whl ]; then   # what the GPU image lacks (textual and the test plugins), carried as wheels
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site
fi
step install 120 python3 -m pip install -q --no-deps --no-build-isolation -e .
command -v perfmon >/dev/null || { echo "perfmon not on PATH"; exit 1; }
step busy_raw 60 python3 scripts/gpu_busy_raw.py
step doctor 300 perfmon doctor
step gpu_step_cost 200 python3 bench/bench_gpu_step_cost.py --cuda --seconds 3 --rounds 5
for s in healthy host_sync data_loading; do step "demo_$s" 90 demo "$s"; done
step pytest_gpu 200 python3 -m pytest -m gpu -p no:randomly -p no:cacheprovider --no-cov -q -rs ${GPU_TESTS:-tests}
step fast_tier "${FAST_S:-300}" python3 -m pytest -m "not slow" -p no:randomly -p no:cacheprovider --no-cov -q \
    --timeout 60
echo "=== summary"
printf '%s\n' "${summary[@]}"
