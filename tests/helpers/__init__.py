"""Helpers shared by the test files: records built as the probe builds them (``records``), the
report of a run model (``reports``), the ``perfmon`` command line (``cli``) and a free port
(``net``). One copy each, so a test's expectations cannot drift from the code they describe."""
