"""The sampler thread: reads slow-changing numbers (host, devices, memory) at 1–2 Hz.

Sources are small objects with ``name`` and ``read() -> dict``; the sampler
merges their sections into one ``sample`` record. A source that raises is
counted and, after ``MAX_FAILURES`` in a row, switched off with one warning
event, so a broken driver costs nothing after the first few seconds. Anything else
that fails in a tick (merging, emitting, the extra records) or in a source's
``flush`` goes to ``on_error`` (``Probe.report_error``: rate-limited warnings), so no
failure is silent and the thread never dies.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

MAX_FAILURES = 5


class Source(Protocol):
    name: str

    def read(self) -> dict[str, Any]:
        """Return record sections to merge, e.g. ``{"host": {...}}``, or ``{}``."""


def flush_source(source: Any) -> None:
    """Sources with periodic records of their own (comm) may define ``flush()``: emit what is pending."""
    flush = getattr(source, "flush", None)
    if flush is not None:
        flush()


class Sampler(threading.Thread):
    def __init__(self, sources: list[Source], emit: Callable[[dict[str, Any]], None], hz: float = 1.0,
                 extra_records: Callable[[], list[dict[str, Any]]] | None = None,
                 on_error: Callable[[str, BaseException], None] | None = None) -> None:
        super().__init__(name="perfmon-sampler", daemon=True)
        self.sources = list(sources)
        self.emit = emit
        self.period = 1.0 / max(0.1, min(hz, 10.0))
        self.extra_records = extra_records
        self.on_error = on_error
        self.failures: dict[str, int] = {}
        self.cost_s: dict[str, float] = {}   # cumulative seconds per source (benchmarks read it)
        self.stop_event = threading.Event()

    def add(self, source: Source) -> None:
        self.sources = self.sources + [source]

    def run(self) -> None:
        while not self.stop_event.wait(self.period):
            self.tick()

    def tick(self) -> None:
        """One sample that never raises: a failure is reported and the next tick tries again."""
        try:
            self.sample_once()
        except Exception as exc:
            self._report("sampler tick", exc)

    def sample_once(self) -> dict[str, Any]:
        record: dict[str, Any] = {"k": "sample", "t": time.time()}
        for source in self.sources:
            t0 = time.perf_counter()
            try:
                sections = source.read()
            except Exception as exc:
                self._failed(source, exc)
                continue
            finally:
                self.cost_s[source.name] = self.cost_s.get(source.name, 0.0) + time.perf_counter() - t0
            self.failures[source.name] = 0
            for key, value in sections.items():
                if isinstance(value, dict) and isinstance(record.get(key), dict):
                    record[key].update(value)
                else:
                    record[key] = value
        self.emit(record)
        if self.extra_records is not None:
            for extra in self.extra_records():
                self.emit(extra)
        return record

    def flush(self) -> None:
        """At close, after the thread stopped: let sources emit their last pending records."""
        for source in self.sources:
            try:
                flush_source(source)
            except Exception as exc:
                self._report(f"{source.name} flush", exc)

    def _report(self, where: str, exc: BaseException) -> None:
        if self.on_error is not None:
            try:
                self.on_error(where, exc)
            except Exception:
                pass

    def _failed(self, source: Source, exc: Exception) -> None:
        n = self.failures.get(source.name, 0) + 1
        self.failures[source.name] = n
        if n >= MAX_FAILURES:
            self.sources = [s for s in self.sources if s is not source]
            self.emit({"k": "event", "t": time.time(), "name": "warning",
                       "message": f"{source.name} sampling switched off after {n} failures: {exc!r}"[:300]})
