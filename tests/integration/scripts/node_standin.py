"""An ssh stand-in whose hosts are PID namespaces on this machine (PERFMON_VIA="python node_standin.py
BASE {host}"): runs the command "on" a host, i.e. inside the PID and mount namespaces of the process
whose PID (as this machine sees it) is in BASE/<host>/pid, with PERFMON_DIR=BASE/<host>. A command
there sees only that host's processes, as on a node of its own.

A host named ``down`` fails the way ssh does when a node is unreachable (exit 255, one line on stderr).
"""

import os
import sys

base, host, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
if host == "down":
    sys.stderr.write(f"ssh: connect to host {host} port 22: Connection refused\n")
    sys.exit(255)
with open(os.path.join(base, host, "pid")) as f:
    pid = f.read().strip()
os.environ["PERFMON_DIR"] = os.path.join(base, host)
os.execvp("nsenter", ["nsenter", "--target", pid, "--pid", "--mount", "--", *argv])
