"""Simulated device layer for tests: a simulated NVML (``pynvml`` stand-in) and a simulated
CUDA backend (memory statistics, timing events, sync debug mode). Everything here is a
SIMULATION with scripted values; no test using it says anything about a real GPU.
"""
