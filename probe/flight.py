"""torch's flight recorders, read in process for stall records.

torch keeps one recorder per kind of completion event, each with its own dump:

* ``_dump_nccl_trace_json``: ProcessGroupNCCL's recorder (CUDA events); only in torch builds
  with NCCL. NCCL groups record here and only here.
* ``_dump_fr_trace_json``: the generic recorder (CPU events): gloo and the other CPU backends.

Reading only the generic one on a CUDA build returns an empty recorder for an NCCL job, so
every recorder this torch has is read and each entry is tagged with its backend. Both keep
``TORCH_FR_BUFFER_SIZE`` entries (formerly ``TORCH_NCCL_TRACE_BUFFER_SIZE``; 2000 by default in
torch 2.13), read once when the recorder is first used: 0 at process start turns it off for the
life of the process.

An entry's state follows torch: ``scheduled`` (enqueued, the device has not started it),
``started``, ``completed`` (the device finished it; ``retired`` once the host saw that too).
A recorder knows a start only when the backend records a start event: NCCL does with
``TORCH_NCCL_ENABLE_TIMING=1`` (or desync debug), gloo never does. Without one, an entry not
completed is ``enqueued``: the host called it, whether the device or the network began it is
unknown.
"""

from __future__ import annotations

import json
import os
from typing import Any

MAX_FLIGHT = 64      # dump entries looked at per recorder (the newest)
MAX_ENTRIES = 8      # entries not retired kept per recorder in the record

RECORDERS = (("nccl", "_dump_nccl_trace_json"), ("generic", "_dump_fr_trace_json"))
_BUFFER_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
_TIMING_VARS = ("TORCH_NCCL_ENABLE_TIMING", "NCCL_ENABLE_TIMING", "TORCH_NCCL_DESYNC_DEBUG", "NCCL_DESYNC_DEBUG")


def flight_recorder() -> dict[str, Any] | None:
    """``{"flight": ...}`` from every recorder this torch has, in a process group job; an empty
    one says why (``note``). None outside an initialized process group."""
    try:
        import torch.distributed as dist
        if not dist.is_available() or not dist.is_initialized():
            return None
        from torch._C import _distributed_c10d as c10d
    except Exception:
        return None
    dumps = [(name, json.loads(dump(True, True))) for name, attr in RECORDERS
             if (dump := getattr(c10d, attr, None)) is not None]
    if not dumps:
        return None
    return {"flight": merge([parse_flight(dump, source=name) for name, dump in dumps])}


def parse_flight(dump: dict[str, Any], source: str) -> dict[str, Any]:
    """One recorder's JSON dump as ``{source, groups: {group: {enqueued, started, completed,
    backend}}, entries: [{op, group, seq, state, backend}]}``: per group, the sequence numbers of
    the last collective enqueued, started and completed (-1: none), and the newest entries the
    host has not retired."""
    raw = [e for e in list(dump.get("entries") or [])[-MAX_FLIGHT:] if isinstance(e, dict)]
    starts = _tracks_starts(source, raw)
    entries = []
    for entry in raw:
        if entry.get("retired"):
            continue
        backend, _, op = str(entry.get("profiling_name") or "?").rpartition(":")
        entries.append({"op": op, "group": _group(_pg(entry)), "seq": _int(entry.get("collective_seq_id")),
                        "state": _state(entry, starts), "backend": backend or _backend(source)})
    backends = {_group(_pg(e)): str(e.get("profiling_name") or "").rpartition(":")[0] or None for e in raw}
    # ``pg_status`` is keyed by the group's uid, entries name it; they differ once a process made groups
    # before (a default group created again is named "0" under a new uid)
    names = {str(e["pg_id"]): _pg(e) for e in raw if e.get("pg_id") is not None}
    groups: dict[str, dict[str, Any]] = {}
    for pg_id, status in list((dump.get("pg_status") or {}).items())[:MAX_FLIGHT]:
        if isinstance(status, dict):
            group = _group(names.get(str(pg_id), pg_id))
            groups[group] = {key: _int(status.get(f"last_{key}_collective"))
                             for key in ("enqueued", "started", "completed")}
            groups[group]["backend"] = backends.get(group) or _backend(source)
    return {"source": source, "groups": groups, "entries": entries[-MAX_ENTRIES:]}


def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The recorders read as one ``flight``: ``sources`` (those read), ``source`` (the same joined by
    '+', for 1.0 readers), every group either recorder reports with its sequence numbers, the entries
    of all, and ``note`` when none recorded anything.

    A group both recorders report (the default world of ``init_process_group("cpu:gloo,cuda:nccl")``
    carries CPU tensors on gloo and CUDA tensors on NCCL) has one sequence per backend, each counting
    only its own calls: both are kept, each under ``group:backend`` (``world:nccl``, ``world:gloo``),
    and so are the group's entries, so the numbers of neither are lost or mixed."""
    reported: dict[str, list[str]] = {}
    for part in parts:
        for group, status in part["groups"].items():
            reported.setdefault(group, []).append(str(status.get("backend") or part["source"]))
    shared = {g for g, backends in reported.items() if len(backends) > 1}
    groups: dict[str, dict[str, Any]] = {}
    entries: list[dict[str, Any]] = []
    for part in parts:
        for group, status in part["groups"].items():
            groups[_qualified(group, status.get("backend") or part["source"], shared)] = status
        entries.extend(dict(e, group=_qualified(e["group"], e.get("backend") or part["source"], shared))
                       for e in part["entries"])
    flight: dict[str, Any] = {"source": "+".join(p["source"] for p in parts), "sources": [p["source"] for p in parts],
                              "groups": groups, "entries": entries}
    if not groups and not entries:
        flight["note"] = _empty_reason()
    return flight


def _qualified(group: str, backend: str, shared: set[str]) -> str:
    """A group both recorders report, named with its backend; any other keeps its name."""
    return f"{group}:{backend}" if group in shared else group


def from_flight(flight: dict[str, Any]) -> dict[str, Any]:
    """``seq`` and ``inflight`` as the recorder sees them: a group whose last enqueued collective
    is not completed has it in flight (its op from the entry of that number, when kept)."""
    seq: dict[str, int] = {}
    inflight = []
    ops = {(e["group"], e["seq"]): e["op"] for e in flight.get("entries", [])}
    for group, status in flight.get("groups", {}).items():
        enqueued, completed = status.get("enqueued"), status.get("completed")
        if enqueued is None or enqueued < 0:
            continue
        seq[group] = enqueued
        if completed is None or completed < enqueued:
            inflight.append({"op": ops.get((group, enqueued), "collective"), "group": group, "seq": enqueued})
    return {"seq": seq, "inflight": inflight}


def fill_from_flight(record: dict[str, Any]) -> None:
    """Complete the probe's ledger with the recorder. A group the ledger never saw (calls made
    from C++, no ``watch()``) takes the recorder's numbers. A group it saw keeps the ledger's; when
    no call of the ledger is in flight, an NCCL group's call not completed is taken from the
    recorder (NCCL calls return once enqueued; a gloo call that returned is done, its recorder
    entry retired a moment later) if both count the same calls on that group (torch also counts
    calls the probe does not wrap, and then the numbers are not comparable)."""
    groups = record["flight"].get("groups", {})
    flight = from_flight(record["flight"])
    seq = record.setdefault("seq", {})
    known = dict(seq)
    for group, n in flight["seq"].items():
        seq.setdefault(group, n)
    inflight = record.setdefault("inflight", [])
    if not inflight:
        inflight.extend(c for c in flight["inflight"] if c["group"] not in known or (
            known[c["group"]] == c["seq"] and groups[c["group"]].get("backend") == "nccl"))


def _tracks_starts(source: str, entries: list[dict[str, Any]]) -> bool:
    """Does this recorder see a collective start? Evidence in the dump, or NCCL with timing on."""
    if any(_int(e.get("time_discovered_started_ns")) for e in entries):
        return True
    return source == "nccl" and any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
                                    for v in _TIMING_VARS)


def _state(entry: dict[str, Any], starts: bool) -> str:
    state = entry.get("state")
    if state in ("completed", "started"):
        return str(state)
    return "scheduled" if starts else "enqueued"


def _empty_reason() -> str:
    for var in _BUFFER_VARS:
        value = os.environ.get(var)
        if value is not None:
            if _int(value) == 0:
                return f"{var}=0 at process start turned the flight recorder off (torch keeps 2000 entries by default)"
            break
    return "no collective recorded yet"


def _pg(entry: dict[str, Any]) -> Any:
    """The entry's group name: ``process_group`` is ``[name, description]``, else its uid ``pg_id``."""
    group = entry.get("process_group")
    return group[0] if isinstance(group, (list, tuple)) and group else entry.get("pg_id")


def _backend(source: str) -> str | None:
    return "nccl" if source == "nccl" else None


def _group(name: Any) -> str:
    return "world" if str(name) in ("0", "default_pg") else str(name)


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
