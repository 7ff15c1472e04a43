"""Convert the straggler paper's public traces into the records a perfmon probe sends.

"Understanding Stragglers in Large Model Training Using What-if Analysis" (OSDI '25) published three
jobs' per-operation traces (github.com/ByteDance-Seed/StragglerAnalysis, Apache-2.0, ``data/``): one
parquet file per job with a row per operation (``dp_rank``, ``stage``, ``rank``, ``step``, ``optype``,
``start_ts``, ``duration``, ``seq_id``, ``mb_id``) and the job's layout in ``meta-*.yaml``. This
script turns each into what perfmon's probe would have sent for that job: per rank a ``hello``, a
``layout`` record and one ``step`` record per step whose ``ops`` list the step's operations (wire
1.5, docs/layout.md), on the device clock (the traces time GPU kernels). The records are written,
gzip-compressed msgpack, to ``tests/data/straggler_paper/<trace>.msgpack.gz``: what the tests and
``bench/whatif_paper.py`` read, without pyarrow. Every step of every trace is kept; times are
rounded to single precision (about 4 µs at the longest step, 46 s).

The mapping of the paper's operation types onto perfmon's operations (its compute ops are stage
compute, its pp-comm point-to-point pairs, its collectives run in the process group named):

    forward-compute / backward-compute   fwd / bwd (micro-batch mb_id)
    forward-send, backward-recv          send / recv with the next stage (same replica)
    forward-recv, backward-send          recv / send with the previous stage
    params-all-gather                    all_gather       on the stage's data-parallel group
    grads-reduce-scatter                 reduce_scatter   on the stage's data-parallel group
    separate-grads-all-reduce            all_reduce       on the stage's data-parallel group
    embedding-grads-all-reduce           all_reduce       between the first and the last stage
    layernorm-grads-all-reduce           all_reduce       in the worker's tensor-parallel group
    optimizer-clip-main-grad             all_reduce       over the world (the gradient norm)
    optimizer, gc                        opt, compute

Run (pyarrow is needed here only; ``pip install pyarrow``), with the repository's ``data/`` at SRC
(``git -C StragglerAnalysis archive HEAD data LICENSE | tar -x -C SRC``):

    python bench/paper_traces.py SRC/data [--out tests/data/straggler_paper]
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import sys
from pathlib import Path
from typing import Any

import msgpack

TRACES = ("AR", "ST", "SE")
OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "straggler_paper"
COMPUTE = {"forward-compute": "fwd", "backward-compute": "bwd", "optimizer": "opt", "gc": "compute"}
DP_GROUP = {"params-all-gather": "all_gather", "grads-reduce-scatter": "reduce_scatter",
            "separate-grads-all-reduce": "all_reduce"}
# p2p: (perfmon kind, the peer's stage relative to this one)
P2P = {"forward-send": ("send", 1), "forward-recv": ("recv", -1), "backward-send": ("send", -1),
       "backward-recv": ("recv", 1)}


def meta(path: Path) -> dict[str, Any]:
    """The ``key: value`` lines of a ``meta-*.yaml`` (flat, scalars only)."""
    out: dict[str, Any] = {}
    for line in path.read_text().splitlines():
        if ":" in line:
            key, value = (x.strip() for x in line.split(":", 1))
            out[key] = int(value) if value.lstrip("-").isdigit() else value
    return out


def layout_of(job: dict[str, Any]) -> tuple[list[str], list[int]]:
    """Megatron's rank order, outer to inner: pp, dp, then the ranks that split one worker (tp, cp)."""
    dims, sizes = ["pp", "dp"], [job["pp_size"], job["dp_size"]]
    for name, key in (("cp", "dsp_size"), ("tp", "tp_size")):
        if job[key] > 1:
            dims.append(name)
            sizes.append(job[key])
    return dims, sizes


def convert(parquet: Path, job: dict[str, Any]) -> list[list[Any]]:
    """[rank, record] pairs: each rank's hello, layout and step records, steps in order."""
    import pyarrow.parquet as pq  # the one place pyarrow is needed

    table = pq.read_table(parquet, columns=["dp_rank", "stage", "rank", "step", "optype", "start_ts", "duration",
                                            "mb_id"]).to_pydict()
    rows = sorted(zip(table["step"], table["rank"], table["start_ts"], table["optype"], table["duration"],
                      table["dp_rank"], table["stage"], table["mb_id"]),
                  key=lambda r: (r[0], r[1], r[2], 0 if r[3].endswith("send") else 1))
    dims, sizes = layout_of(job)
    inner = len(dims) > 2
    rank_at = {}                                     # (dp, stage) -> the trace's rank of that worker
    coord = {}
    for _, rank, _, _, _, dp, stage, _ in rows:
        rank_at[(dp, stage)] = rank
        rest = rank - (stage * job["dp_size"] + dp) * (job["world_size"] // (job["pp_size"] * job["dp_size"]))
        coord[rank] = [stage, dp] + ([rest] if inner else [])
    pp = job["pp_size"]
    step_start = {}
    for step, _, start, *_ in rows:
        step_start[step] = min(start, step_start.get(step, start))
    ops: dict[tuple[int, int], list[list[Any]]] = collections.defaultdict(list)
    ends: dict[tuple[int, int], float] = {}
    for step, rank, start, optype, dur, dp, stage, mb in rows:
        t0 = start - step_start[step]
        ends[(step, rank)] = max(ends.get((step, rank), 0.0), t0 + dur)
        ops[(step, rank)].append(_op(optype, t0, dur, dp, stage, mb, pp, rank, rank_at))
    out: list[list[Any]] = []
    for rank in sorted(coord):
        out.append([rank, {"k": "hello", "t": 0.0, "proto": [1, 5], "job": f"straggler-paper-{job['trial_name']}",
                           "rank": rank, "world_size": job["world_size"], "host": f"trace-{job['trial_name']}"}])
        out.append([rank, {"k": "layout", "t": 0.0, "dims": dims, "sizes": sizes, "coord": coord[rank],
                           "source": "mesh"}])
        for step in sorted(step_start):
            if (step, rank) in ops:
                out.append([rank, {"k": "step", "t": step_start[step] + ends[(step, rank)], "step": step,
                                   "start": step_start[step], "dur": ends[(step, rank)], "gap": 0.0,
                                   "ops_clock": "device", "ops": ops[(step, rank)]}])
    return out


def _op(optype: str, t0: float, dur: float, dp: int, stage: int, mb: int, pp: int, rank: int,
        rank_at: dict[tuple[int, int], int]) -> list[Any]:
    if optype in COMPUTE:
        return [COMPUTE[optype], t0, dur, mb if mb >= 0 else -1, -1]
    if optype in P2P:
        kind, delta = P2P[optype]
        return [kind, t0, dur, -1, rank_at[(dp, (stage + delta) % pp)]]
    if optype in DP_GROUP:
        return [DP_GROUP[optype], t0, dur, -1, f"dp@pp{stage}"]
    if optype == "embedding-grads-all-reduce":
        return ["all_reduce", t0, dur, -1, f"embedding@dp{dp}"]
    if optype == "layernorm-grads-all-reduce":
        return ["all_reduce", t0, dur, -1, f"tp@{rank}"]
    if optype == "optimizer-clip-main-grad":
        return ["all_reduce", t0, dur, -1, "world"]
    raise ValueError(f"unknown operation type {optype!r}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("src", type=Path, help="the paper repository's data/ directory")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in TRACES:
        job = meta(args.src / f"meta-{name}.yaml")
        records = convert(args.src / f"trace-{name}.parquet", job)
        body = msgpack.packb(records, use_bin_type=True, use_single_float=True)
        path = args.out / f"{name}.msgpack.gz"
        path.write_bytes(gzip.compress(body, compresslevel=9, mtime=0))
        print(f"{name}: {len(records)} records, {path.stat().st_size / 1e6:.2f} MB -> {path}")
    expected = {name: expected_figures(args.src, name) for name in TRACES}
    (args.out / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")
    return 0


def expected_figures(src: Path, name: str) -> dict[str, Any]:
    """The paper's own results for one trace (``result-*.json``, ``ms-*.json``, ``mw-*.json``): the whole
    slowdown S and what it attributes to each replica and stage, and its M_W and M_S metrics."""
    result = json.loads((src / f"result-{name}.json").read_text())
    return {"S": result["blocking_slowdown"],
            "by_replica": {k: v for k, v in result["blocking_decompose_by_dp_rank"].items()},
            "by_stage": {k: v for k, v in result["blocking_decompose_by_stage"].items()},
            "Mw": json.loads((src / f"mw-{name}.json").read_text())["Mw"],
            "Ms": json.loads((src / f"ms-{name}.json").read_text())["Ms"]}


if __name__ == "__main__":
    sys.exit(main())
