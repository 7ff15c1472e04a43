"""The analysis core, shared by the TUI, ``perfmon report`` and the tests.

``runmodel`` ingests wire records into ``buffers`` (bounded per-rank deques) and hands
out ``views`` (frozen ``JobView`` snapshots) computed by ``stats`` (window statistics);
``verdict`` walks the flowchart over a view; ``report`` turns a view and its verdict into the
report JSON, every number from the one ``metrics`` table; ``analysis`` fronts them all. Pure
Python: no Textual, no torch, no sockets or files (tests/unit/test_import_hygiene.py).
"""
