"""One public surface: the disabled probe (PERFMON_DISABLE=1, DataLoader workers, a failed start)
has every public method and attribute of ``Probe``, with the same signatures, so a script that
runs with monitoring on runs unchanged with it off."""

from __future__ import annotations

import inspect

import pytest

import probe
from probe.core import Probe
from probe.disabled import _Disabled

# one call per public method, written once and made the same way on both probes:
# (positional args, keyword args)
CALLS = {
    "loader": [(([1, 2, 3],), {}), ((), {"iterable": [1, 2]})],
    "step": [((64,), {}), ((64, 2048, 1e12), {}), ((), {"samples": 8, "tokens": 16, "flops": 1.0}), ((), {})],
    "phase": [(("forward",), {}), ((), {"name": "backward"})],
    "event": [(("checkpoint",), {"seconds": 1.5}), ((), {"name": "custom"})],
    "emit": [(({"k": "event", "t": 0.0, "name": "custom"},), {}), ((), {"record": {"k": "event", "t": 0.0}})],
    "watch": [((), {}), ((None, None), {}), ((), {"model": None, "optimizer": None, "memory": False})],
    "report_error": [(("test", ValueError("x")), {}), ((), {"where": "test", "exc": ValueError("y")})],
    "add_step_hooks": [((), {}), ((None, None), {}), ((), {"begin": None, "end": None})],
    "remove_step_hooks": [((), {}), ((None, None), {}), ((), {"begin": None, "end": None})],
    "handle_request": [(({"k": "request", "t": 0.0, "id": 1, "op": "profile"},), {}),
                       ((), {"request": {"k": "request", "t": 0.0, "id": 2, "op": "nothing"}})],
    "begin_step": [((), {}), ((None,), {}), ((), {"cpu0": None})],
    "restart_step_clock": [((), {}), ((None,), {}), ((), {"cpu0": None})],
    "progress": [((), {})],
    "add_step": [((1.0, 2.0), {}), ((1.0, 2.0, {"forward": 0.5}, 4, 0.1), {}),
                 ((), {"start": 1.0, "end": 2.0, "phases": None, "samples": None, "data_cpu": None, "tokens": 64})],
    "add_tap": [((lambda rec: None,), {}), ((), {"tap": lambda rec: None})],
    "close": [((), {})],
}


def _public(cls: type) -> dict[str, object]:
    return {name: value for name, value in inspect.getmembers(cls) if not name.startswith("_")}


def _public_instance_attrs(obj: object) -> set[str]:
    return {name for name in vars(obj) if not name.startswith("_")}


@pytest.fixture
def live(tmp_path):
    mon = probe.start(job="parity", serve=False)
    assert isinstance(mon, Probe)
    yield mon
    mon.close()


def test_disabled_has_every_public_method_with_the_same_signature():
    ours, theirs = _public(Probe), _public(_Disabled)
    assert set(ours) == set(theirs)
    for name, member in ours.items():
        if isinstance(member, property):
            assert isinstance(theirs[name], property), name
            continue
        assert callable(member) and callable(theirs[name]), name
        assert list(inspect.signature(member).parameters) == list(inspect.signature(theirs[name]).parameters), name
        for p_ours, p_theirs in zip(inspect.signature(member).parameters.values(),
                                    inspect.signature(theirs[name]).parameters.values()):
            assert (p_ours.kind, p_ours.default) == (p_theirs.kind, p_theirs.default), (name, p_ours.name)


def test_every_public_method_is_exercised_here():
    methods = {n for n, m in _public(Probe).items() if not isinstance(m, property)}
    assert methods == set(CALLS)


def test_same_public_attributes(live):
    assert _public_instance_attrs(live) == _public_instance_attrs(_Disabled())


@pytest.mark.parametrize("name", sorted(CALLS))
def test_each_call_works_the_same_way_on_both(live, monkeypatch, name):
    monkeypatch.setenv("PERFMON_DISABLE", "1")
    off = probe.start(job="parity-off")
    assert isinstance(off, _Disabled)
    steps_before = live.steps
    for args, kwargs in CALLS[name]:
        results, inside = [], []
        for mon in (live, off):
            result = getattr(mon, name)(*args, **kwargs)
            if name in ("step", "phase"):
                with result:
                    inside.append(tuple(getattr(mon.step_args, f) for f in ("samples", "tokens", "flops")))
            elif name == "loader":
                result = list(result)
            results.append(result)
        if name == "loader":
            assert results[0] == results[1]
        if name == "step":      # inside a step: the live probe holds what was passed, the disabled one nothing
            bound = inspect.signature(Probe.step).bind(None, *args, **kwargs)
            bound.apply_defaults()
            assert inside == [(bound.arguments["samples"], bound.arguments["tokens"], bound.arguments["flops"]),
                              (None, None, None)]
    # the two properties read the same way after any call: ``steps`` an int, counting each step made
    # through ``step()`` or ``add_step()`` on the live probe and none on the disabled one; ``step_args``
    # the arguments of the current step, each a number or None (unknown)
    made = len(CALLS[name]) if name in ("step", "add_step") else 0
    assert type(live.steps) is type(off.steps) is int
    assert (live.steps - steps_before, off.steps) == (made, 0)
    for mon in (live, off):
        for field in ("samples", "tokens", "flops"):
            value = getattr(mon.step_args, field)
            assert value is None or type(value) in (int, float), (type(mon), field, value)


def test_a_script_runs_unchanged_with_monitoring_off(monkeypatch):
    """The reported crash: ``mon.step(64)`` under PERFMON_DISABLE=1."""
    monkeypatch.setenv("PERFMON_DISABLE", "1")
    mon = probe.start(job="off")
    for _batch in mon.loader(range(3)):
        with mon.step(64, tokens=128):
            with mon.phase("forward"):
                pass
    mon.event("checkpoint", seconds=0.1)
    assert mon.steps == 0 and mon.step_args.flops is None
    mon.close()
