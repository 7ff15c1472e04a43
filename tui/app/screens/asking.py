"""A screen that asks the selected rank's probe for something on open (and again on its key),
on a worker thread, and shows what the job's stream brings back (``tui.stream.requests``).

The result record reaches every viewer and the recording, so the body is drawn from the app's
``JobView`` on each refresh (``show``); the request only says whether it was accepted."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from perfmon_analysis.views import JobView
from tui.app.widgets import glyphs
from tui.errors import UserError
from tui.stream.requests import Askable, ask

TIMEOUT = 120.0


class AskScreen(Screen[None]):
    """Subclasses set ``op``, ``params``, ``heading``, ``doing`` and draw ``body``."""

    op = ""
    params: dict[str, Any] = {}
    heading = ""
    doing = ""             # "profiling": what the status line says while waiting

    def __init__(self, view: JobView | None, target: Askable | str, label: str) -> None:
        super().__init__()
        self.view = view
        self.target = target
        self.label = label
        self.status = ""

    def body(self, view: JobView | None) -> list[Text]:   # pragma: no cover - abstract
        raise NotImplementedError

    def compose(self) -> ComposeResult:
        yield Static(self.heading.format(label=self.label), id="ask-title")
        with VerticalScroll():
            yield Static(self._content(), id="ask-body")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.action_ask()

    def show(self, view: JobView | None) -> None:
        self.view = view
        for body in self.query("#ask-body").results(Static):    # none until the screen is composed
            body.update(self._content())

    def _content(self) -> Group:
        head = [Text(self.status, style=glyphs.ACCENT), Text("")] if self.status else []
        return Group(*head, *self.body(self.view))

    def action_ask(self) -> None:
        if isinstance(self.target, str):
            self._say(self.target)
            return
        self._say(f"{self.doing} {self.label}: the next {self.params.get('steps')} steps ...")
        target = self.target
        self.run_worker(lambda: self._ask(target), thread=True, exclusive=True, group=self.op)

    def _ask(self, target: Askable) -> None:
        try:
            ask(target, self.op, dict(self.params), TIMEOUT, self.op)
            message = f"{self.op} of {self.label} done (it also reached the recording, if any)"
        except UserError as exc:
            message = str(exc)
        self.app.call_from_thread(self._say, message)

    def _say(self, message: str) -> None:
        self.status = message
        self.show(self.view)
