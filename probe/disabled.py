"""The probe that does nothing: ``PERFMON_DISABLE=1``, DataLoader workers, a failed start.

It has exactly the public surface of ``probe.core.Probe``, with the same signatures
(``tests/unit/test_api_parity.py`` walks every public method and attribute of both), so a
script that runs with monitoring on runs unchanged with it off.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

from probe.attachments import Attachments


class _Null:
    """Stands for ``Probe.step()``/``phase()`` context managers and ``step_args``."""

    samples = tokens = flops = None

    def __enter__(self) -> _Null:
        return self

    def __exit__(self, et: Any, ev: Any, tb: Any) -> Literal[False]:
        return False


_NULL = _Null()


class _NoFailures:
    counts: dict[str, int] = {}

    def failed(self, where: str, exc: BaseException | None = None) -> None:
        pass


class _Disabled:
    """Same API as ``Probe``, does nothing."""

    def __init__(self) -> None:
        self.job = ""
        self.rank = 0
        self.local_rank = 0
        self.world_size = 1
        self.restart = 0
        self.pid = os.getpid()
        self.name = ""
        self.socket_path: Path | None = None
        self.token_path: Path | None = None
        self.record_path: Path | None = None
        self.problems: list[str] = []
        self.closed = True
        self.first_batch_wait: float | None = None
        self.loader_iterators: collections.deque = collections.deque(maxlen=0)
        self.opening: Callable[[], bool] | None = None
        self.attached = Attachments()
        self.failures = _NoFailures()
        self.device: dict[str, Any] = {"type": "cpu", "name": "", "count": 0}
        self.sender = None
        self.sampler = None
        self.stall_watch = None
        self.where = None

    def loader(self, iterable: Iterable[Any]) -> Iterator[Any]:
        yield from iterable          # a generator, like Probe.loader (it has close(), send(), throw())

    def step(self, samples: float | None = None, tokens: float | None = None,
             flops: float | None = None) -> Any:
        return _NULL

    def phase(self, name: str) -> Any:
        return _NULL

    def event(self, name: str, **fields: Any) -> None:
        pass

    def emit(self, record: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass

    def watch(self, model: Any = None, optimizer: Any = None, **options: Any) -> None:
        pass

    @property
    def steps(self) -> int:
        return 0

    @property
    def step_args(self) -> Any:
        return _NULL

    def progress(self) -> tuple[int, float | None, bool, int | None, float | None]:
        return 0, None, False, None, None

    def report_error(self, where: str, exc: BaseException) -> None:
        pass

    def add_step_hooks(self, begin: Callable[[], None] | None = None,
                       end: Callable[[dict[str, Any], dict[str, float]], None] | None = None) -> None:
        pass

    def remove_step_hooks(self, begin: Callable[[], None] | None = None,
                          end: Callable[[dict[str, Any], dict[str, float]], None] | None = None) -> None:
        pass

    def add_tap(self, tap: Callable[[dict[str, Any]], None]) -> None:
        pass

    def handle_request(self, request: dict[str, Any]) -> str | None:
        return "perfmon is disabled in this process"

    def begin_step(self, cpu0: float | None = None) -> None:
        pass

    def restart_step_clock(self, cpu0: float | None = None) -> None:
        pass

    def add_step(self, start: float, end: float, phases: dict[str, float] | None = None,
                 samples: float | None = None, data_cpu: float | None = None, tokens: float | None = None,
                 gap_cpu: float | None = None) -> None:
        pass
