"""Which nodes a job runs on, and how to reach each: host lists, SLURM, Kubernetes pods, and the
transport template.

The transport is whatever the user already has: by default ``ssh -T -o BatchMode=yes {host}``
(no password prompt can hang the viewer), ``kubectl exec`` for pods found by ``--k8s``, or a
``--via`` / ``PERFMON_VIA`` template such as ``srun --overlap -w {host}`` or ``ssh -J jump {host}``. The
template is split like a shell command, ``{host}`` is replaced, and the relay's own argv is appended.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import urllib.parse
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tui.errors import UserError

DEFAULT_VIA = "ssh -T -o BatchMode=yes {host}"
RELAY_ARGV = ("perfmon", "relay", "--stdio")
MAX_HOSTS = 4096
FAN_OUT = 64          # transports started at once by run_on_hosts

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_hostlist(spec: str) -> list[str]:
    """SLURM's host-list syntax: ``n[01-03,07],gpu-a,x[1-2]y`` -> n01 n02 n03 n07 gpu-a x1y x2y.

    Zero padding follows the range's first number, as SLURM does. A malformed list is one
    ``UserError`` line."""
    hosts: list[str] = []
    for item in _split_top(spec):
        hosts.extend(_expand_one(item, spec))
        if len(hosts) > MAX_HOSTS:
            raise UserError(f"host list {spec!r}: more than {MAX_HOSTS} hosts")
    return list(dict.fromkeys(hosts))          # in order, each once


def _split_top(spec: str) -> list[str]:
    """Split on commas outside brackets."""
    items, depth, cur = [], 0, ""
    for ch in spec.strip():
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise UserError(f"host list {spec!r}: unbalanced ']'")
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    if depth:
        raise UserError(f"host list {spec!r}: unbalanced '['")
    items.append(cur)
    return [i.strip() for i in items if i.strip()]


def _expand_one(item: str, spec: str) -> list[str]:
    start = item.find("[")
    if start < 0:
        return [item]
    end = item.index("]", start)
    prefix, body, rest = item[:start], item[start + 1:end], item[end + 1:]
    tails = _expand_one(rest, spec) if rest else [""]
    out: list[str] = []
    for part in body.split(","):
        m = _RANGE.match(part.strip())
        if not m:
            raise UserError(f"host list {spec!r}: cannot read range {part!r}")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo):
            raise UserError(f"host list {spec!r}: range {part!r} runs backwards")
        if int(hi) - int(lo) > MAX_HOSTS:
            raise UserError(f"host list {spec!r}: range {part!r} is over {MAX_HOSTS} hosts")
        width = len(lo)
        out.extend(f"{prefix}{n:0{width}d}{tail}" for n in range(int(lo), int(hi) + 1) for tail in tails)
    return out


def read_hostfile(path: str | Path) -> list[str]:
    """One host per line (MPI/DeepSpeed hostfiles: the first word; ``slots=`` and comments ignored)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise UserError(f"{path}: cannot read the hostfile: {exc.strerror or exc}") from None
    hosts = [line.split("#", 1)[0].split()[0] for line in text.splitlines() if line.split("#", 1)[0].strip()]
    if not hosts:
        raise UserError(f"{path}: no hosts in the hostfile")
    return expand_hostlist(",".join(hosts))


def slurm_hosts(job_id: str | None = None) -> list[str]:
    """The nodes of a SLURM job: ``scontrol show hostnames`` of its node list, or, inside the job
    (no id given), ``SLURM_JOB_NODELIST`` expanded here when scontrol is missing."""
    nodelist = None
    if job_id is None:
        nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
        if nodelist is None:
            raise UserError("--slurm without a job id needs SLURM_JOB_NODELIST (run it inside the allocation)")
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        if nodelist is None:
            raise UserError(f"--slurm {job_id}: scontrol not found on this machine")
        return expand_hostlist(nodelist)
    if nodelist is None:
        out = _run([scontrol, "show", "job", str(job_id)])
        m = re.search(r"(?:^|\s)NodeList=(\S+)", out)
        if not m or m.group(1) in ("(null)", ""):
            raise UserError(f"--slurm {job_id}: the job has no nodes (pending or finished?)")
        nodelist = m.group(1)
    return [h for h in _run([scontrol, "show", "hostnames", nodelist]).split() if h]


def k8s_pods(selector: str, namespace: str | None = None) -> list[str]:
    """The running pods of a label selector, by name: ``kubectl get pods -l SELECTOR``."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise UserError("--k8s: kubectl not found on this machine")
    argv = [kubectl, "get", "pods", "-l", selector, "--field-selector=status.phase=Running",
            "-o", "jsonpath={.items[*].metadata.name}"]
    if namespace:
        argv += ["--namespace", namespace]
    pods = _run(argv).split()
    if not pods:
        where = f" in namespace {namespace}" if namespace else ""
        raise UserError(f"--k8s {selector}: no running pod matches{where}")
    return pods


def k8s_via(namespace: str | None) -> str:
    """The transport into a pod: ``kubectl exec -i {host} [--namespace N] --``."""
    return "kubectl exec -i {host}" + (f" --namespace {shlex.quote(namespace)}" if namespace else "") + " --"


def _run(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UserError(f"{' '.join(argv)}: {exc}") from None
    if out.returncode != 0:
        raise UserError(f"{' '.join(argv)}: {(out.stderr.strip().splitlines() or ['failed'])[-1]}")
    return out.stdout


def via_argv(template: str, host: str, job: str, relay: tuple[str, ...] = RELAY_ARGV) -> list[str]:
    """The command that runs the relay for ``job`` on ``host`` through the transport template
    (``relay``: how the far side runs perfmon; ``perfmon demo --nodes`` uses its own interpreter)."""
    return transport_argv(template, host, [*relay, job])


def transport_argv(template: str, host: str, command: Sequence[str]) -> list[str]:
    """``command`` run on ``host`` through the transport template."""
    try:
        parts = shlex.split(template)
    except ValueError as exc:
        raise UserError(f"--via {template!r}: {exc}") from None
    if not parts:
        raise UserError("--via: empty transport template")
    return [p.replace("{host}", host) for p in parts] + list(command)


def encode_via(template: str) -> str:
    """The transport template as one shell-safe word (``perfmon relay --nodes-via``): it crosses ssh
    (a remote shell) and srun or kubectl exec (an argv) alike."""
    return urllib.parse.quote(template, safe="")


def transport(via: str | None, k8s: str | None = None, namespace: str | None = None) -> str:
    """The transport template: ``--via``, else ``PERFMON_VIA``, else kubectl exec for pods, else ssh."""
    return via or os.environ.get("PERFMON_VIA") or (k8s_via(namespace) if k8s else DEFAULT_VIA)


@dataclass(frozen=True)
class HostRun:
    """What one command run on one host through the transport gave."""

    host: str
    code: int          # its exit status (the transport's own when it failed: ssh's 255)
    out: str
    err: str

    def problem(self) -> str:
        """Its last line on stderr, the one a perfmon command's refusal is."""
        return (self.err.strip().splitlines() or [f"exit status {self.code}"])[-1]


def run_on_hosts(hosts: Sequence[str], via: str, command: Sequence[str], timeout: float) -> list[HostRun]:
    """``command`` on every host at once through the transport; each host's outcome, in ``hosts``
    order. A host that does not answer within ``timeout`` is killed and reads exit status 124."""
    def one(host: str) -> HostRun:
        argv = transport_argv(via, host, command)
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return HostRun(host, 124, "", f"no answer within {timeout:g} s")
        except OSError as exc:
            return HostRun(host, 127, "", f"{argv[0]}: {exc.strerror or exc}")
        return HostRun(host, done.returncode, done.stdout, done.stderr)

    with ThreadPoolExecutor(max_workers=min(FAN_OUT, len(hosts)) or 1) as pool:
        return list(pool.map(one, hosts))


def choose_hosts(hosts: str | None, hostfile: str | None, slurm: str | bool | None,
                 k8s: str | None = None, namespace: str | None = None) -> list[str] | None:
    """The hosts named by exactly one of ``--hosts``, ``--hostfile``, ``--slurm``, ``--k8s`` (pod
    names); None if none was."""
    given = [x for x in (hosts, hostfile, slurm, k8s) if x not in (None, False)]
    if len(given) > 1:
        raise UserError("give only one of --hosts, --hostfile, --slurm, --k8s")
    if namespace is not None and k8s is None:
        raise UserError("--namespace goes with --k8s")
    if k8s is not None:
        found = k8s_pods(k8s, namespace)
    elif hosts is not None:
        found = expand_hostlist(hosts)
    elif hostfile is not None:
        found = read_hostfile(hostfile)
    elif slurm not in (None, False):
        found = slurm_hosts(None if slurm is True else str(slurm))
    else:
        return None
    if not found:
        raise UserError("no hosts given")
    return found
