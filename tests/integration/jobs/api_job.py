"""A training-shaped loop using the probe API with known timings (no torch needed).

argv: JOB STEPS DATA_MS FWD_MS BWD_MS [--wait] [--linger]  (--wait: block on stdin "go" before training;
--linger: after training, print "drained" once the sender has every step, then block on stdin)
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


for _batch in mon.loader(batches()):
    with mon.step(samples=8):
        with mon.phase("forward"):
            time.sleep(fwd_ms / 1000)
        with mon.phase("backward"):
            time.sleep(bwd_ms / 1000)
if "--linger" in sys.argv:
    # say when the sender has taken every step off the hot-path queue: a viewer that connects after this
    # line can only get those steps from the backfill
    deadline = time.monotonic() + 20
    while mon._q and time.monotonic() < deadline:
        time.sleep(0.01)
    print("drained" if not mon._q else "not drained", flush=True)
    sys.stdin.readline()
mon.close()
print("done", flush=True)
