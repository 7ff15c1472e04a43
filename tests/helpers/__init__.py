"""Helpers shared by test files (never copied between them): records built as the probe builds them
(``records``), the report of a run model (``reports``), the ``perfmon`` command line (``cli``), a free
port (``net``), a headless Chromium (``chromium``), and the jobs and scrapes of ``ops_jobs`` and
``prometheus``."""
