"""``perfmon demo``: real built-in training workloads that show each bottleneck.

``cli`` launches and stops the ranks (no torch in the launcher except to ask
whether a GPU exists for the GPU-only scenario), ``workload`` is the training
process itself, ``scenarios`` the table of what each scenario does to the job.
"""
