"""Wire protocol v1: the one place that defines frames, record kinds, keys and limits.

The probe (producer) owns the format; the viewer, the recorder reader and the
report import it from here so that both sides can never drift apart.

Frame = u32 big-endian payload length + one msgpack map. The length
is checked against ``MAX_FRAME`` before any body byte is buffered, the body is
decoded with ``unpackb`` (whose internal limits then collapse to the frame
length) and the result is schema-checked before anyone sees it.
"""

from __future__ import annotations

# Record keys (v1.0). Absent or None means unknown. Times are unix seconds, durations
# seconds, sizes bytes, shares fractions 0..1 unless named otherwise.
#
# hello   proto [1,1], job, rank, local_rank, world_size, host, pid, restart, argv, torch, python (version),
#         name (socket base name), device (the job's device when the probe started, as in ``sample``),
#         gpus (1.x: the GPUs this process can see, a fact about the host whatever the job uses:
#         count, name, memory_total, driver, status (why none, e.g. "no NVIDIA GPU: NVML library not found"))
# step    step (int, increasing), start, dur (from the end of the previous step, includes the
#         data wait), gap (part of dur between the previous step's end and entering this one,
#         outside the loader wait: checkpoints, eval, logging; ETTR's lost time),
#         phases {data, forward, backward, optimizer, other, <user phases>} (phases + gap = dur),
#         data_cpu (main-thread CPU s spent inside the loader wait: num_workers=0 loading; absent
#         with loader workers; read only while waits exceed 50 µs, shorter ones cost nothing),
#         comm {seconds, exposed, bytes, ops, estimated (bool: exposed is an estimate)},
#         cpu (1.3: the training thread's CPU s over the span cpu_span names; absent when not measured,
#         e.g. a zero-code step whose end was settled late), cpu_span ("body": API mode, from
#         step()'s __enter__ to its __exit__, the loader wait before __enter__ not in it (a loader
#         wait inside the with block is); "active": zero-code mode and the trainer callbacks, from the
#         step's start, its first batch fetch, to its end, so the data waits are in it and data_cpu
#         is part of cpu), cpu_others (1.3, with cpu: the CPU s of the process's other threads
#         over the step, torch's intra-op threads among them), intra_threads (torch.get_num_threads()
#         on the training thread),
#         syncs (host-device syncs in the step), sync_site ("file:line" of the most frequent),
#         samples, tokens, flops, flops_source ("user"|"counted"|"6N"), mem {allocated, peak, reserved},
#         gpu_time (device time of the step from events), lead (host-ahead-of-device s; both on a
#         sampled subset of steps, about ten a second: probe.gpu.cuda.StepTimer),
#         gpu_step (the step gpu_time/lead belong to: device results arrive a step or more late),
#         whole (1.5, with lead: the host finished queueing that step before the device began it, asked
#         of its first event on the training thread as the step ended),
#         gpu_phases {forward, backward, optimizer} (device s, when the step had one forward)
# sample  host {cpu (cores busy in this process), cpu_count, sys_cpu, rss, mem_used, mem_total,
#         mem_limit, mem_limit_source, loader_workers, loader_cpu (mean share of one core per
#         loader worker), loader_cpu_max}, gpus [{index, name, uuid (1.x), util, mem_used, mem_total,
#         power_w, power_limit_w, energy_mj (1.x: NVML's total energy counter since the driver
#         loaded, mJ; None without one), sm_clock, sm_clock_max, temp_c, throttle [reason names],
#         pcie_tx, pcie_rx, nvlink_tx, nvlink_rx (bytes/s), and on GPM devices sm_active,
#         sm_occupancy, tensor_active, dram_bw (0..1), lost (true once NVML says the GPU is lost),
#         why (1.x: {field: reason} for util and sm_active when NVML gave none, in NVML's words, e.g.
#         "NVML: NotSupported on this GPU", "GPM unsupported on this GPU ..."), errors (1.x: failed
#         NVML calls for this GPU so far)}],
#         gpu_status (str when no GPU data), compute {dtype ("fp32"|"tf32"|"bf16"|"fp16"|"fp8"),
#         peak_flops (FLOP/s for that dtype, None when unknown: no MFU), peak_source, flops_source,
#         params (trainable parameter count), device} (after watch()),
#         device (1.x; the job's device now, from where its tensors live (probe.gpu.job); a reader takes
#         the newest one over the hello's: type "cpu"|"cuda"|other torch device types, name, count,
#         index (CUDA), memory_total, peak_flops {dtype: FLOP/s}, driver, status (CUDA: why the GPU's
#         counters cannot be read as this job's, e.g. NVML not loadable; busy is then not measured),
#         offloaded (1.x, CUDA: the share of the watched parameters' bytes held in host memory: CPU
#         offload, a CPU embedding in front of GPU layers))
# memory  device, params, grads, optimizer, activations, cache, fragmentation, other, limit,
#         peak, reserved, allocated, alloc_retries, ooms; CUDA: peak = allocated peak since the
#         allocator's last reset (never reset by the probe), peak_reserved, fragmentation = inactive
#         split bytes, other = NVML-used - reserved; CPU: rss, peak = peak RSS, limit_source,
#         activations = bytes autograd saved in a sampled forward
# comm    backend, world_size, nccl_timing, ops [{op, count, bytes, seconds, busbw (bytes/s), busbytes}]
#         (cumulative since start; seconds/busbw None when not timed; busbytes (1.x) = Σ timed bytes x
#         busbw_factor(op, that call's group size), so a viewer's window busbw is Δbusbytes / Δseconds)
# event   name (checkpoint|oom|exception|restart|warning|error|first_batch|eval|<custom>), message,
#         seconds, source, unmeasured (1.x, on a warning: the quantity it says the probe cannot
#         measure, "comm"; the message is the reason the verdict quotes), and free-form fields;
#         exception/oom (1.x): error (the exception type's name), step (steps done before it), file,
#         line, function, call (the user's line it came from, probe/exceptions.py); eval (1.x, zero-
#         code mode): forwards (training-mode forwards that no backward followed), seconds
# (not a record: ``perfmon run --record`` leaves {job, cmd, returncode, t} beside the recordings
#         as <job>.run.p<pid>.exit.json: how the command ended, read by perfmon report)
# drops   count (since the last drops record), total, reason
# bye     (clean shutdown)
#
# 1.1 kinds (sent only to viewers whose hello says minor >= 1; see KIND_MINOR):
# stall   the training thread has made no step progress for longer than the stall threshold;
#         repeated every few seconds while it lasts. since (unix s of the last progress), seconds,
#         threshold (s), step (last completed step, -1 before the first), where ("step": inside a
#         step, "between": after a step's end, e.g. checkpoint/eval, "loader": inside the
#         DataLoader's next()), stack [innermost last: "file:line in function"] (training thread),
#         inflight [{op, group (name), group_rank, group_size, seq (per-group sequence number of
#         this rank's call), bytes, since (unix s)}], seq {group: calls issued} (every group this rank
#         has used), loader {waiting, awaited_pid (the worker whose batch is awaited), workers [{pid, alive,
#         cpu (share of one core)}]} (when a
#         DataLoader is watched), device {pending (bool: queued GPU work not finished) } (CUDA),
#         flight {source (the sources joined by "+"), sources (1.x: the recorders read, "nccl":
#         ProcessGroupNCCL's, "generic": gloo and other CPU backends), groups {group: {enqueued,
#         started, completed (sequence numbers, -1: none), backend}} (a group both recorders report,
#         one sequence per backend, is listed once per backend as "group:backend", its entries too),
#         entries [{op, group, seq, state
#         ("scheduled": enqueued, not started | "started" | "completed" | "enqueued": not completed,
#         the recorder sees no starts), backend ("nccl"|"gloo"|...)}] (not retired), note (why it is
#         empty)} (torch's flight recorders, probe/flight.py), n (1 for the first record of this stall),
#         moving (the stack differs from the previous look: busy, e.g. evaluating, rather than hung;
#         absent when there was no previous look)
# resumed progress again after a stall: seconds (how long it lasted), step
# request (viewer -> probe, after its hello) id (the viewer's number for it), op ("profile" |
#         "capture" | "detach"), and the op's parameters: profile: steps (1..50, default 5), depth (0..8,
#         default 3); capture: steps (1..20, default 3); detach (a probe that ``perfmon inject`` started:
#         remove it from the process): result (absolute path the probe writes its JSON outcome to)
# answer  (probe -> the asking viewer) id, op, ok (bool), reason (one line, when refused)
# profile the result of a profile request, sent to every 1.1 viewer, recorded, and to viewers that
#         arrive later: id, steps (profiled), first_step, last_step, depth, step_s (wall s per
#         profiled step), timer ("perf_counter"|"cuda_events"), truncated, peak_flops, peak_source,
#         flops_note (why FLOPs are missing), error (why the profile failed), modules [{name (dotted
#         path, "" the root), type, depth, params, calls (per step), fwd_s, bwd_s (s per step), flops,
#         fwd_flops (per step; absent when not counted)}]
# capture the result of a capture request (torch.profiler over the next N steps), sent like profile:
#         id, steps, first_step, last_step, wall_s (the captured steps' wall time), path (the gzip
#         Chrome trace on the rank's host), top [{name, self_s, calls}] (operators by self time:
#         device time on GPU, CPU time on CPU), device_busy (GPU: kernel time over wall_s, merged),
#         gaps [{seconds, at_s}] (GPU: longest idle stretches, at_s from the first kernel), error
#
# 1.2 kinds (a relay and its viewer: ``perfmon relay``, ``tui.stream.remote``):
# summary (relay -> viewer, per rank the viewer does not follow in full, once a second, only when it
#         changed) src, v (the payload's version, ``perfmon_analysis.summary.SUMMARY_VERSION``: a newer
#         one may add keys, never changes one's meaning), stats {the rank's window statistics, keys
#         ``perfmon_analysis.summary.STATS_PAYLOAD``}, memory {keys ``MEMORY_PAYLOAD``}, comm {op: [count, bytes,
#         seconds, busbytes]} (the window's collectives), steps (steps done), first_start, last_end,
#         inside, unseen (the rank's running totals for ETTR), loader_seen (bool); computed over
#         the window the viewer's subscribe gave
# subscribe (viewer -> relay, on its stdin after the viewer's hello) srcs [the ranks, by ``src``, whose
#         step, memory and comm records the viewer wants in full; "*" = every rank], window [steps,
#         seconds] (the viewer's window, for the summaries); replaces the previous subscription. A
#         newly subscribed rank's buffered records are sent first. Without a 1.2 viewer hello the
#         relay forwards every record of every rank (what a 1.1 viewer reads).
#
# 1.3 kinds:
# where   where the training thread's steps go (probe.where): stack samples taken inside steps,
#         counts for the interval t0..t1 only (a viewer sums its window), at most one record every
#         2 s while steps run. t0, t1 (unix s), hz (nominal sampling rate), samples (taken in the
#         interval), lines [{file (as the code object has it), line, function, call (the line's
#         source, stripped, <= 80 chars; absent if unreadable), lib ("module.qualname" of the
#         innermost library frame below the user's line; absent when that line is innermost),
#         state ("waiting": since the previous sample the thread was on CPU, or runnable on a run
#         queue (Linux schedstat, where readable), for less than half the wall time | "busy"; absent
#         when neither can be read), n (samples)}] (the 20 largest), other (samples in no listed
#         line), runq (share of the sampled in-step time the thread was runnable but waited for a
#         core: CPU contention; absent without schedstat). The user's line is the innermost frame
#         outside the standard library, site-packages/dist-packages and perfmon; else the innermost.
#
# 1.4 keys (no new kinds: a 1.3 reader ignores them):
# sample  cost (the probe's own cost, probe/cost.py; running totals since the probe started, so a
#         reader differences two samples) {train_s (training-thread s inside the probe's step calls,
#         hooks included), train_steps (the steps train_s covers), hooks {name: s} (the step hooks'
#         part of train_s), threads {name: CPU s} (each perfmon thread by name: sender, sampler, stall,
#         where, poller, flops, profile, capture, ...; null when no thread CPU clock is readable),
#         process_cpu (the whole process's CPU s, the denominator of the threads' share),
#         queue_items (hot-path queue), viewer_bytes (queued for viewers), backfill_bytes,
#         sent_bytes, recorded_bytes, wrappers {step|loader|phase: [calls, s a call]} (step()
#         calls, loader() batches and phase() uses so far, each with the cost a call that train_s
#         does not see, calibrated at start-up; absent when not calibrated: why.wrappers),
#         why {part: why it is not measured}}
# profile, capture: cost {thread_cpu_s (CPU s of the probe thread that built the result)}; their
#         training-thread cost is the window's steps against the steps before, from the step records
#
# 1.5 kinds (a group relay and its viewer: the relay tree, ``tui.commands.relay.group``, docs/tree.md):
# group   (group relay -> viewer, once a second) key [dimension, value] (["group", name]: the relay's
#         own group of nodes), ranks, timed (past warm-up), stalled, silent, steps (the most done),
#         sums {samples_per_s, tokens_per_s}, q {quantity (``perfmon_analysis.groups.QUANTITIES``):
#         {n, min, min_rank, min_src, max, max_rank, max_src, sketch {z (count at zero), b [bucket,
#         count, ...] (DDSketch buckets, ``groups.SKETCH_ACCURACY``)}}}, relays_down [nodes],
#         reps [src: the ranks sent on in full, hello, samples, stalls and summaries; a rank of the
#         group not listed is held only in the counts], silent_s {src: seconds since its newest
#         record}, keys [further reductions of the same ranks by another grouping, each {key, ranks,
#         ...} as above]. The ranks' own records come tagged with ``src`` = "node/rank's src".
# 1.5 (the job's parallel layout and what the what-if simulates, docs/layout.md):
# layout  (new kind; sent when the rank's place is first known or changes, and in every backfill) dims [names,
#         outer to inner: "pp", "dp", "tp", ... as the job's DeviceMesh names them], sizes [int], coord [this
#         rank's coordinate along each dim], source ("mesh": a DeviceMesh | "pipeline": a
#         torch.distributed.pipelining stage's index and count, replicas from its process group's ranks)
# step    ops [[kind, start, dur, mb, peer(, waited)]] (at most MAX_OPS a step, in the order they were issued): the
#         step's operations, start in s after the record's ``start``, dur in s; kind "fwd" | "bwd" (a
#         pipeline stage's compute of micro-batch mb, -1 for none), "send" | "recv" (point-to-point; peer the
#         other side's global rank; a receive lasts from its posting to its completion; a send's waited, when
#         present, is when (s after start) the host began to wait for it, blocked until it completed), or a collective's
#         name (peer the process group's name, the same on every member: "world", or torch's group name);
#         ops_clock ("host": times are the training thread's, the time between two ops is its own work |
#         "device": the device's timeline), ops_dropped (ops of the step over MAX_OPS, not sent),
#         comm.p2p_exposed (s the training thread was blocked in point-to-point calls and their waits: a
#         pipeline stage's time waiting on its neighbours, its bubble; absent when none)
# 1.5 (the iteration attributed: where the time between steps goes, docs/verdict.md "Between steps"):
# step    gap_cpu (the training thread's CPU s in ``gap``: from the previous step's end to this one's
#         start, the batch fetch that opens it excluded; zero-code mode; absent when not measured)
# where   samples, lines and other stay the in-step ones; between [lines, as ``lines``, each with
#         before/after: how many of its samples were taken in the loop's function at a line before /
#         after the lines it runs the step from, probe.where.LoopLines; absent when 0] (samples taken
#         between steps: after a step's end, before the next one's start, outside the batch fetch;
#         the gaps they fell in ended in this interval: samples after the last step are never sent),
#         between_samples (int), between_other (int), between_runq (as runq, over the between-step
#         samples); holders [{thread (name), file, line, function, call, span ("step" | "between"),
#         n}] (the 20 largest: samples in which the training thread waited while that Python thread
#         was on CPU and held the GIL, probe.where)
# summary loop, gaps (the rank's running totals of time between steps, and of it the loop's own work: ETTR
#         and the pauses' share)
import struct
from collections.abc import Iterator
from typing import Any

import msgpack

PROTO: tuple[int, int] = (1, 5)
MAX_FRAME = 1 << 20          # 1 MiB, checked before the body is read
MAX_DEPTH = 8                # records are shallow; anything deeper is hostile
MAX_CONTAINER = 10_000       # entries in any one map or list
VIEWER_MAX_FRAME = 4096      # viewers only ever send a small hello
MAX_OPS = 512                # ``ops`` of one step record (wire 1.5): 6 per micro-batch on a middle pipeline stage

HEADER = struct.Struct(">I")

# Each kind with the minor version that introduced it. A probe sends a 1.x kind only to a
# viewer whose hello announced that minor (a 1.0 viewer rejects kinds it does not know); a 1.1+
# reader skips kinds newer than itself (``UnknownKind``, counted by the decoder).
KIND_MINOR: dict[str, int] = {
    "hello": 0, "step": 0, "sample": 0, "memory": 0, "comm": 0, "event": 0, "drops": 0, "bye": 0,
    "stall": 1, "resumed": 1, "request": 1, "answer": 1, "profile": 1, "capture": 1,
    "summary": 2, "subscribe": 2,
    "where": 3,
    "group": 5,
    "layout": 5,
}
KINDS = frozenset(KIND_MINOR)

# Keys a reader relies on, with the types they must have when present.
# Minor versions may add keys; readers ignore keys they do not know.
_NUM = (int, float)
REQUIRED: dict[str, dict[str, tuple[type, ...]]] = {
    "hello": {"proto": (list, tuple)},
    "step": {"step": (int,), "dur": _NUM},
    "sample": {},
    "memory": {},
    "comm": {"ops": (list,)},
    "event": {"name": (str,)},
    "drops": {"count": (int,)},
    "bye": {},
    "stall": {"seconds": _NUM},
    "resumed": {},
    "request": {"op": (str,), "id": (int,)},
    "answer": {"id": (int,)},
    "profile": {"modules": (list,)},
    "capture": {"steps": (int,)},
    "summary": {"stats": (dict,)},
    "subscribe": {"srcs": (list,)},
    "where": {"samples": (int,), "lines": (list,)},
    "group": {"key": (list,)},
    "layout": {"dims": (list,), "sizes": (list,), "coord": (list,)},
}
OPTIONAL: dict[str, dict[str, tuple[type, ...]]] = {
    "hello": {"job": (str,), "rank": (int,), "world_size": (int,), "pid": (int,), "host": (str,),
              "restart": (int,), "device": (dict,), "argv": (list,)},
    "step": {"start": _NUM, "phases": (dict,), "comm": (dict,), "mem": (dict,), "syncs": _NUM,
             "samples": _NUM, "tokens": _NUM, "flops": _NUM, "cpu": _NUM, "cpu_span": (str,),
             "cpu_others": _NUM, "intra_threads": (int,), "ops": (list,), "ops_clock": (str,),
             "ops_dropped": (int,), "gap_cpu": _NUM},
    "sample": {"gpus": (list,), "host": (dict,), "cost": (dict,)},
    "stall": {"since": _NUM, "seconds": _NUM, "threshold": _NUM, "step": (int,), "where": (str,),
              "stack": (list,), "inflight": (list,), "seq": (dict,), "loader": (dict,), "device": (dict,),
              "flight": (dict,), "moving": (bool,)},
    "resumed": {"seconds": _NUM, "step": (int,)},
    "request": {"steps": (int,), "depth": (int,)},
    "answer": {"ok": (bool,), "reason": (str,), "op": (str,)},
    "profile": {"id": (int,), "steps": (int,), "first_step": (int,), "last_step": (int,), "depth": (int,),
                "step_s": _NUM, "peak_flops": _NUM, "truncated": (bool,), "error": (str,), "cost": (dict,)},
    "capture": {"id": (int,), "first_step": (int,), "last_step": (int,), "wall_s": _NUM, "path": (str,),
                "top": (list,), "device_busy": _NUM, "gaps": (list,), "error": (str,), "cost": (dict,)},
    "summary": {"src": (str,), "v": (int,), "memory": (dict,), "comm": (dict,), "steps": (int,), "first_start": _NUM,
                "last_end": _NUM, "inside": _NUM, "loop": _NUM, "gaps": _NUM, "unseen": _NUM, "loader_seen": (bool,)},
    "subscribe": {"window": (list,)},
    "where": {"t0": _NUM, "t1": _NUM, "hz": _NUM, "other": (int,), "runq": _NUM, "between": (list,),
              "between_samples": (int,), "between_other": (int,), "between_runq": _NUM, "holders": (list,)},
    "group": {"q": (dict,), "reps": (list,), "silent_s": (dict,), "keys": (list,), "src": (str,)},
    "layout": {"source": (str,)},
}


class ProtocolError(Exception):
    """A frame or record that breaks the protocol. ``str()`` is one line for the user."""


class ProtocolMismatch(ProtocolError):
    """Peers speak different major versions."""


class UnknownKind(ProtocolError):
    """A record kind this reader does not know: from a newer minor version, skipped and counted."""


def format_proto(proto: Any) -> str:
    try:
        return f"{int(proto[0])}.{int(proto[1])}"
    except (TypeError, ValueError, IndexError, KeyError):
        return "?"


def mismatch_message(viewer: Any, probe: Any) -> str:
    return f"protocol version mismatch (viewer {format_proto(viewer)}, probe {format_proto(probe)})"


def check_compatible(peer_proto: Any, *, we_are: str) -> None:
    """Raise ProtocolMismatch unless ``peer_proto`` has our major version.

    ``we_are`` is "viewer" or "probe" so the message names each side correctly.
    """
    try:
        major = int(peer_proto[0])
    except (TypeError, ValueError, IndexError, KeyError):
        major = -1
    if major != PROTO[0]:
        if we_are == "viewer":
            raise ProtocolMismatch(mismatch_message(PROTO, peer_proto))
        raise ProtocolMismatch(mismatch_message(peer_proto, PROTO))


class Encoder:
    """Packs records into frames. Not thread-safe: one per thread (the sender's)."""

    def __init__(self) -> None:
        self._packer = msgpack.Packer(use_bin_type=True, autoreset=True)

    def frame(self, record: dict[str, Any]) -> bytes:
        body = self._packer.pack(record)
        if len(body) > MAX_FRAME:
            raise ProtocolError(f"record of kind {record.get('k')!r} is {len(body)} bytes, over the 1 MiB frame limit")
        return HEADER.pack(len(body)) + body


def encode(record: dict[str, Any]) -> bytes:
    """One-off frame encoding (tests, viewers' hello)."""
    return Encoder().frame(record)


def decode_body(body: bytes) -> dict[str, Any]:
    """Decode and validate one frame body; raise ProtocolError on anything wrong."""
    try:
        obj = msgpack.unpackb(body, raw=False, strict_map_key=True, use_list=True)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError,
            msgpack.BufferFull, TypeError, MemoryError, RecursionError) as exc:
        raise ProtocolError(f"undecodable frame ({type(exc).__name__})") from None
    return validate(obj)


def _check_shape(obj: Any, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise ProtocolError(f"record nested deeper than {MAX_DEPTH} levels")
    if isinstance(obj, dict):
        if len(obj) > MAX_CONTAINER:
            raise ProtocolError("record has an oversized map")
        for key, value in obj.items():
            if not isinstance(key, str):
                raise ProtocolError("record has a non-string key")
            if isinstance(value, (dict, list)):
                _check_shape(value, depth + 1)
    elif isinstance(obj, list):
        if len(obj) > MAX_CONTAINER:
            raise ProtocolError("record has an oversized list")
        for value in obj:
            if isinstance(value, (dict, list)):
                _check_shape(value, depth + 1)


def validate(obj: Any) -> dict[str, Any]:
    """Schema check: a map with a known kind, a time, and correctly typed known keys.

    A well-formed record of an unknown kind raises ``UnknownKind`` (a newer minor version's:
    readers skip it); anything else unknown is a ``ProtocolError``. Unknown keys are allowed
    (minor versions add keys).
    """
    if not isinstance(obj, dict):
        raise ProtocolError("frame is not a map")
    _check_shape(obj, 1)
    kind = obj.get("k")
    if not isinstance(kind, str) or kind not in KINDS:      # str first: a list or map kind is unhashable
        if isinstance(kind, str) and isinstance(obj.get("t"), _NUM):
            raise UnknownKind(f"unknown record kind {kind[:20]!r}")
        raise ProtocolError(f"unknown record kind {str(kind)[:20]!r}")
    t = obj.get("t")
    if not isinstance(t, _NUM) or isinstance(t, bool):
        raise ProtocolError(f"{kind} record without a time")
    for key, types in REQUIRED[kind].items():
        if not isinstance(obj.get(key), types) or isinstance(obj.get(key), bool):
            raise ProtocolError(f"{kind} record: '{key}' missing or of the wrong type")
    for key, types in OPTIONAL.get(kind, {}).items():
        value = obj.get(key)
        if value is not None and (not isinstance(value, types) or (isinstance(value, bool) and bool not in types)):
            raise ProtocolError(f"{kind} record: '{key}' of the wrong type")
    return obj


class FrameDecoder:
    """Incremental decoder for a byte stream of frames.

    ``feed()`` buffers at most one frame (``max_frame`` + 4 bytes) before it
    must be consumed, so a hostile length prefix cannot make it allocate more.
    """

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self._buf = bytearray()
        self._max = max_frame
        self.offset = 0  # stream offset of the next undecoded frame, for messages
        self.skipped = 0  # records of kinds newer than this reader, skipped

    def feed(self, data: bytes) -> Iterator[dict[str, Any]]:
        self._buf += data
        while True:
            if len(self._buf) < HEADER.size:
                return
            (length,) = HEADER.unpack_from(self._buf)
            if length > self._max:
                raise ProtocolError(f"frame at offset {self.offset} claims {length} bytes, "
                                    f"over the {self._max}-byte limit")
            if len(self._buf) < HEADER.size + length:
                return
            body = bytes(self._buf[HEADER.size:HEADER.size + length])
            del self._buf[:HEADER.size + length]
            self.offset += HEADER.size + length
            try:
                record = decode_body(body)
            except UnknownKind:
                self.skipped += 1
                continue
            yield record

    @property
    def pending(self) -> int:
        """Bytes received but not yet forming a whole frame (a torn frame at EOF)."""
        return len(self._buf)


# -- bus bandwidth ---------------------------------------------------------------------------
# nccl-tests doc/PERFORMANCE.md: busbw = algbw x factor(n), n = the collective's group size;
# DeepSpeed comms_logging uses the same. Here because both the probe (``comm`` records) and
# the viewer (window busbw) compute it, and this is the one module both import.
_ALL_REDUCE = frozenset({"all_reduce", "allreduce"})
_N_MINUS_1 = frozenset({"all_gather", "allgather", "all_gather_into_tensor", "reduce_scatter", "reducescatter",
                        "reduce_scatter_tensor", "all_to_all", "alltoall", "all_to_all_single"})


def busbw_factor(op: str, n: int | None) -> float | None:
    """nccl-tests factor for ``op`` over ``n`` ranks; None where busbw has no meaning.

    all-reduce 2(n-1)/n; all-gather, reduce-scatter, all-to-all (n-1)/n; broadcast,
    reduce, point-to-point and unknown ops 1. A backend prefix ("gloo:all_reduce") is
    ignored. A one-rank group moves nothing over a bus: its busbw is its algbw (1).
    None for a barrier (no payload) or an unknown group size.
    """
    name = op.lower().rsplit(":", 1)[-1]
    if n is None or n < 1 or name == "barrier":
        return None
    if n == 1:
        return 1.0
    if name in _ALL_REDUCE:
        return 2.0 * (n - 1) / n
    if name in _N_MINUS_1:
        return (n - 1) / n
    return 1.0
