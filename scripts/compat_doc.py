"""Write docs/compatibility.md from the compatibility matrix in tests/compat/matrix.py."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.compat.matrix import render  # noqa: E402

if __name__ == "__main__":
    out = ROOT / "docs" / "compatibility.md"
    out.write_text(render())
    print(f"wrote {out}")
