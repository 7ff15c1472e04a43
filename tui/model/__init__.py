"""The analysis core, shared by the TUI, ``perfmon report`` and the tests.

``runmodel`` turns wire records into bounded per-rank buffers and window statistics
and hands out a ``JobView``; ``verdict`` walks the flowchart over that view. Pure
Python: no Textual, no torch, no sockets or files (tests/unit/test_import_hygiene.py).
"""
