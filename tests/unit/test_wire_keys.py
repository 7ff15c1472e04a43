"""The writer's keys and the reader's keys are tied to the one schema: every key a record the probe
builds carries, and every key ``perfmon_analysis.readings`` reads, is named in ``probe/wire.py``'s
key list. A key renamed on one side only, or added without saying what it holds, fails here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.unit.test_record_keys import literal_key_reads

ROOT = Path(__file__).resolve().parents[2]
WIRE = (ROOT / "probe" / "wire.py").read_text()
NAMED = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", WIRE))


def written_keys(source: str) -> list[tuple[str, int]]:
    """(key, line) of each literal key of a record dict (a dict literal whose "k" is a string kind)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Dict):
            keys = {k.value: v for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant)
                    and isinstance(k.value, str)}
            kind = keys.get("k")
            if isinstance(kind, ast.Constant) and isinstance(kind.value, str):
                found += [(k, node.lineno) for k in keys]
    return found


def test_every_key_the_readings_read_is_named_in_the_wire_schema():
    reads = [(p.name, key, line) for p in sorted((ROOT / "perfmon_analysis" / "readings").glob("*.py"))
             for _, key, line in literal_key_reads(p.read_text())]
    assert len(reads) > 100
    assert [f"{name}:{line} {key}" for name, key, line in reads if key not in NAMED] == []


def test_every_key_the_probe_writes_into_a_record_is_named_in_the_wire_schema():
    writes = [(str(p.relative_to(ROOT)), key, line) for p in sorted((ROOT / "probe").rglob("*.py"))
              for key, line in written_keys(p.read_text())]
    assert len(writes) > 30
    assert [f"{name}:{line} {key}" for name, key, line in writes if key not in NAMED] == []


def test_the_checks_find_a_planted_key_on_either_side():
    assert [k for k, _ in written_keys('rec = {"k": "step", "t": 1.0, "durr": 2.0}') if k not in NAMED] == ["durr"]
    assert [k for _, k, _ in literal_key_reads('def f(rec):\n    return rec.get("durr")\n') if k not in NAMED] \
        == ["durr"]
