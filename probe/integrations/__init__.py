"""Framework callbacks (``probe.integrations.lightning``, ``probe.integrations.hf``): step
boundaries from the trainer's own hooks, and perfmon's numbers in the trainer's own logs.

Each module imports its framework; nothing here is imported unless the user imports it.
"""
