"""The verdict's advice (perfmon_analysis.advice): memory, what is large, largest first, and a leak's
fixes named by what grows; the parallelism the collectives show, and its fixes."""

from __future__ import annotations

import dataclasses

from perfmon_analysis.advice import _KIND_FIXES, LARGE_SHARE, comm_fixes, memory_breakdown, memory_fixes, parallelism
from perfmon_analysis.memory_growth import MemoryGrowth
from perfmon_analysis.views import CommOpRow, MemoryMetrics
from tests.unit.verdict_synth import Rank, job

# activations half of what is broken down, the optimizer a fifth, params and grads a tenth each
MEM = MemoryMetrics(params_bytes=100, grads_bytes=100, optimizer_bytes=200, activations_bytes=500, cache_bytes=0,
                    other_bytes=None)
SNAPSHOT = ("torch.cuda.memory._record_memory_history() then _dump_snapshot() shows which call allocated what "
            "stays")


def _growth(series: str, kind: str | None) -> MemoryGrowth:
    return MemoryGrowth(rank=0, series=series, per_step=2e6, per_s=None, steps=50, points=20, first=1, last=2,
                        fit=0.99, steady=True, kind=kind)


def test_the_breakdown_is_each_measured_kind_largest_first():
    assert memory_breakdown(MEM) == [("activations", 500), ("optimizer", 200), ("params", 100), ("grads", 100)]
    assert memory_breakdown(MemoryMetrics(cache_bytes=7, other_bytes=3)) == [("cache", 7), ("other", 3)]


def test_a_leaks_fixes_come_first_named_by_what_grows_then_each_large_kinds():
    fixes = memory_fixes(MEM, _growth("allocated", "activations"))
    assert fixes[:2] == [
        "find what the loop keeps every step (CUDA allocated grows 2.0MB per step, most in activations): a graph "
        "kept alive across steps: retain_graph=True, or a hidden state carried into the next step without "
        ".detach() (RNNs, truncated BPTT)", SNAPSHOT]
    # activations (50%) and the optimizer (20%, exactly the large share) are large; params and grads are not
    assert LARGE_SHARE == 0.2
    assert fixes[2:] == [*_KIND_FIXES["activations"], *_KIND_FIXES["optimizer"]]
    unnamed = memory_fixes(MemoryMetrics(), _growth("rss", None))
    assert unnamed[0] == ("find what the loop keeps every step (host RSS grows 2.0MB per step): tensors the loop "
                          "keeps every step: a loss or an output appended to a list with its graph (keep loss.item() "
                          "or loss.detach()), metrics accumulated as tensors, a cache that never evicts")
    assert unnamed[1] == "tracemalloc snapshots a few hundred steps apart show the Python lines whose memory grows"


def _ops(*seconds_by_op: tuple[str, float]) -> list[CommOpRow]:
    return [CommOpRow(op=op, count=10, bytes=1 << 20, seconds=s, busbw=None, algbw=None, ranks=2)
            for op, s in seconds_by_op]


def test_the_parallelism_in_use_is_each_family_with_a_fifth_of_the_collective_time_most_first():
    # pipeline sends and receives 0.5 s, all-to-all 0.3 s, all-reduce 0.2 s (exactly a fifth), a barrier
    ops = _ops(("all_reduce", 0.2), ("send", 0.3), ("recv", 0.2), ("all_to_all", 0.3), ("barrier", 0.0))
    assert parallelism(ops) == ["pipeline", "expert", "ddp"]
    assert parallelism(_ops(("all_reduce", 0.9), ("all_to_all", 0.1))) == ["ddp"]
    assert parallelism([]) == [] and parallelism(_ops(("barrier", 0.0))) == []


def test_pipeline_and_expert_parallelism_have_fixes_of_their_own():
    view = job(Rank()).view()
    ops = _ops(("send", 0.5), ("all_to_all", 0.5))
    assert comm_fixes(dataclasses.replace(view, comm_ops=ops), "send") == [
        "more micro-batches per step (n_microbatches) shrink the pipeline bubble",
        "an interleaved schedule (ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble) with several stages per "
        "rank",
        "balance the stages: the slowest stage sets the pace of every send and recv",
        "all-to-all carries each token to its experts: a higher capacity factor drops fewer tokens but sends more; "
        "keep the expert-parallel group inside a node",
        "overlap the token exchange with the shared experts' or attention's compute"]
