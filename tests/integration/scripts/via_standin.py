"""An ssh stand-in for multi-node tests (PERFMON_VIA="python via_standin.py BASE {host}"):
runs the command after the host "on" that host, i.e. with PERFMON_DIR=BASE/<host>.

Hosts named ``old`` answer as a perfmon of protocol 2.0 would; ``down`` fails the way ssh does
when a node is unreachable (exit 255, one line on stderr)."""

import os
import struct
import sys
import time

import msgpack

base, host, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
if host == "down":
    sys.stderr.write(f"ssh: connect to host {host} port 22: Connection refused\n")
    sys.exit(255)
if host == "old":
    body = msgpack.packb({"k": "hello", "t": time.time(), "proto": [2, 0], "role": "relay"})
    sys.stdout.buffer.write(struct.pack(">I", len(body)) + body)
    sys.stdout.buffer.flush()
    sys.stdin.read()            # like a relay: until the viewer goes away
    sys.exit(0)
os.environ["PERFMON_DIR"] = os.path.join(base, host)
os.execvp(argv[0], argv)
