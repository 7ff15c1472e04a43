"""A stand-in group relay for one test (PERFMON_VIA="python canned_group_relay.py {host}"): says
hello, sends two ranks in full and a ``group`` record that keeps only one of them on, then dies
(exit status 3) as a killed relay would."""

import sys
import time

from probe import wire

now = time.time()
out = [{"k": "hello", "t": now, "proto": list(wire.PROTO), "role": "group", "job": "canned"}]
for rank in (0, 1):
    src = f"n{rank + 1}/canned.r{rank}.x0.p{100 + rank}"
    out += [{"k": "hello", "t": now, "proto": list(wire.PROTO), "job": "canned", "rank": rank, "world_size": 2,
             "pid": 100 + rank, "src": src},
            {"k": "sample", "t": now, "src": src, "host": {"cpu": 0.5}}]
out.append({"k": "group", "t": now, "key": ["group", "n1"], "ranks": 2, "reps": ["n1/canned.r0.x0.p100"]})
sys.stdout.buffer.write(b"".join(wire.encode(r) for r in out))
sys.stdout.buffer.flush()
time.sleep(0.5)
sys.exit(3)
