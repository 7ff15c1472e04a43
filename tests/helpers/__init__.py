"""Helpers shared by the test files: records built as the probe builds them (``records``), the
report of a run model (``reports``), the ``perfmon`` command line (``cli``), a free port (``net``)
and a headless Chromium (``chromium``). One copy each, so a test's expectations cannot drift from
the code they describe."""
