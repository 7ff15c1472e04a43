"""A ``kubectl`` stand-in for pod discovery tests: each argv is appended to $KUBECTL_LOG as JSON.

``get pods ...`` prints the names in $KUBECTL_PODS (space-separated) as kubectl's jsonpath
output would; ``exec -i POD [--namespace N] -- CMD...`` runs CMD "in" that pod, i.e. with
PERFMON_DIR=$KUBECTL_BASE/POD."""

import json
import os
import sys

args = sys.argv[1:]
with open(os.environ["KUBECTL_LOG"], "a") as log:
    log.write(json.dumps(args) + "\n")
if args[:2] == ["get", "pods"]:
    print(os.environ.get("KUBECTL_PODS", ""), end="")
    sys.exit(0)
if args[:1] == ["exec"] and "--" in args:
    pod = args[2]
    command = args[args.index("--") + 1:]
    os.environ["PERFMON_DIR"] = os.path.join(os.environ["KUBECTL_BASE"], pod)
    os.execvp(command[0], command)
sys.stderr.write(f"error: unknown command {args[:2]}\n")
sys.exit(1)
