"""Job picker: shown by ``perfmon attach`` when several jobs of this user run on this node."""

from __future__ import annotations

import socket
from dataclasses import dataclass

from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Static

from perfmon_analysis import units
from tui.stream.discovery import Endpoint


@dataclass(frozen=True)
class JobChoice:
    """One job as the picker lists it."""

    job: str
    endpoints: tuple[Endpoint, ...]

    @property
    def ranks(self) -> str:
        ranks = sorted(ep.rank for ep in self.endpoints)
        return str(ranks[0]) if len(ranks) == 1 else f"{len(ranks)} ({ranks[0]}–{ranks[-1]})"

    @property
    def age_s(self) -> float:
        return max(ep.age_s for ep in self.endpoints)


def choices(grouped: dict[str, list[Endpoint]]) -> list[JobChoice]:
    return [JobChoice(job, tuple(eps)) for job, eps in sorted(grouped.items())]


class PickerScreen(Screen[JobChoice]):
    """A table of jobs; Enter attaches to the highlighted one, q quits."""

    BINDINGS = [
        Binding("enter", "pick", "attach"),
        Binding("q", "app.quit", "quit"),
        Binding("escape", "app.quit", "quit", show=False),
    ]

    def __init__(self, jobs: list[JobChoice]) -> None:
        super().__init__()
        self.jobs = jobs

    def compose(self) -> ComposeResult:
        yield Static(f"perfmon: {len(self.jobs)} jobs are running here. Pick one (↑/↓, Enter), or q to quit.",
                     id="picker-title")
        table: DataTable = DataTable(id="picker-table", cursor_type="row", zebra_stripes=True)
        table.add_columns("job", "ranks", "host", "pids", "age")
        host = socket.gethostname()
        for choice in self.jobs:
            pids = ",".join(str(ep.pid) for ep in choice.endpoints[:4]) + ("…" if len(choice.endpoints) > 4 else "")
            table.add_row(choice.job, choice.ranks, host, pids, units.age(choice.age_s), key=choice.job)
        yield table

    def on_mount(self) -> None:
        self.query_one(DataTable).focus()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self._choose(event.cursor_row)

    def action_pick(self) -> None:
        self._choose(self.query_one(DataTable).cursor_row)

    def _choose(self, row: int) -> None:
        if 0 <= row < len(self.jobs):
            self.dismiss(self.jobs[row])
