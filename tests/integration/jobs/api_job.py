"""A training-shaped loop using the probe API with known timings (no torch needed).

argv: JOB STEPS DATA_MS FWD_MS BWD_MS [--wait]  (--wait: block on stdin "go" before training)
Prints the socket path first, then "done" when closed.
"""

import sys
import time

import probe

job, steps, data_ms, fwd_ms, bwd_ms = sys.argv[1], int(sys.argv[2]), *map(float, sys.argv[3:6])
mon = probe.start(job=job)
print(mon.socket_path, flush=True)
if "--wait" in sys.argv:
    sys.stdin.readline()


def batches():
    for i in range(steps):
        time.sleep(data_ms / 1000)
        yield i


for batch in mon.loader(batches()):
    with mon.step(samples=8):
        with mon.phase("forward"):
            time.sleep(fwd_ms / 1000)
        with mon.phase("backward"):
            time.sleep(bwd_ms / 1000)
if "--linger" in sys.argv:
    sys.stdin.readline()
mon.close()
print("done", flush=True)
