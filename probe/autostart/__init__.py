"""Start-up hook of zero-code mode: ``perfmon run`` puts this directory first on ``PYTHONPATH``.

It holds only ``sitecustomize.py`` (Python imports that module at start-up), so
nothing else of perfmon becomes importable under a top-level name in the job.
"""
