"""TUI test fixtures: the fixed scenario recordings, written once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tui import scenarios


@pytest.fixture(scope="session")
def recordings(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("recordings")
    return {name: scenarios.write(name, base) for name in scenarios.SCENARIOS}
