"""The ``perfmon`` command: argument parsing and dispatch, nothing else.

Each subcommand lives in its own module in ``tui.commands`` with a ``main(args) -> int``; they are
imported lazily so ``perfmon ls`` never pays for (or needs) Textual or torch.
User mistakes raise ``UserError`` and become one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from tui.errors import UserError

COMMANDS = {
    "demo": "tui.commands.demo.cli",
    "attach": "tui.commands.attach",
    "ls": "tui.commands.ls",
    "run": "tui.commands.run",
    "record": "tui.commands.record",
    "report": "tui.commands.report",
    "compare": "tui.commands.compare",
    "doctor": "tui.commands.doctor",
    "relay": "tui.commands.relay",
    "profile": "tui.commands.profile",
    "export": "tui.commands.export",
    "capture": "tui.commands.capture",
    "inject": "tui.commands.inject.inject",
    "detach": "tui.commands.inject.detach",
}


def _price_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--price-per-device-hour", type=float, default=None, metavar="PRICE",
                   help="price of one device (GPU, or CPU rank) per hour, to put money on what fixing each loss "
                        "buys (default: $PERFMON_PRICE_PER_DEVICE_HOUR)")


def _method_option(p: argparse.ArgumentParser) -> None:
    """How inject/detach enter a process (tui.injector.METHODS; docs/attach.md)."""
    p.add_argument("--method", choices=("auto", "remote-exec", "ptrace"), default="auto",
                   help="how to enter the process: sys.remote_exec (Python 3.14+), ptrace (hypno), or auto: "
                        "remote-exec where it works, else ptrace (default)")


def _hosts_options(p: argparse.ArgumentParser, token: bool = True, relays: bool = True) -> None:
    """A job across nodes: which hosts, and how to reach them (tui.stream.hosts). ``token``: add
    ``--token`` (attach has its own, for host:port). ``relays``: the command reads relays (not
    for inject/detach, which run themselves on each host through the transport)."""
    title = "a job across nodes (one relay per host, started through ssh)" if relays else \
        "a job across nodes (perfmon runs on each host, started through ssh)"
    where = p.add_argument_group(title)
    where.add_argument("--hosts", default=None, metavar="LIST", help="hosts, SLURM syntax allowed: n[01-04],gpu7")
    where.add_argument("--hostfile", default=None, metavar="FILE", help="one host per line (MPI/DeepSpeed style)")
    where.add_argument("--slurm", nargs="?", const=True, default=None, metavar="JOBID",
                       help="the nodes of a SLURM job (default: this allocation's SLURM_JOB_NODELIST)")
    where.add_argument("--k8s", default=None, metavar="SELECTOR",
                       help="the running pods of a label selector (kubectl get pods -l SELECTOR)")
    where.add_argument("--namespace", default=None, metavar="N", help="the pods' namespace, with --k8s")
    where.add_argument("--via", default=None, metavar="TEMPLATE",
                       help="transport, {host} replaced (default: $PERFMON_VIA, else 'ssh -T -o BatchMode=yes {host}'; "
                            "with --k8s 'kubectl exec -i {host} [--namespace N] --')")
    if not relays:
        return
    where.add_argument("--relay-port", type=int, default=None, metavar="PORT",
                       help="instead of a transport: connect to 'perfmon relay --tcp PORT JOB' on each host "
                            "(token: --token or $PERFMON_TOKEN)")
    if token:
        where.add_argument("--token", default=None,
                           help="the relays' token with --relay-port (default: $PERFMON_TOKEN)")
    where.add_argument("--group-size", type=int, default=None, metavar="N",
                       help="a relay tree: one group relay per N hosts (default: 32 hosts a group from 64 hosts "
                            "on; 0: one relay per host whatever the count; docs/tree.md)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="perfmon", description="Why is my training slow right now?")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo = sub.add_parser("demo", help="run a built-in training workload and watch perfmon diagnose it")
    demo.add_argument("--scenario", default="tour", help="tour (default), healthy, data_preprocessing, data_loading, "
                      "communication, load_imbalance, memory, step_gaps, host_sync")
    demo.add_argument("--ranks", type=int, default=None, help="processes (gloo on CPU); scenario default if omitted")
    demo.add_argument("--seconds", type=float, default=None, help="how long to run (headless default 40)")
    demo.add_argument("--headless", action="store_true", help="no TUI: run, then print the report JSON")
    demo.add_argument("--memory-limit", default=None, help="CPU memory limit the memory scenario is judged against")
    demo.add_argument("--record", default=None, metavar="DIR", help="also record the run to DIR")
    demo.add_argument("--nodes", type=int, default=1, help="split the ranks into N 'nodes' on this machine, "
                                                           "viewed through a relay each (as attach --hosts)")

    attach = sub.add_parser("attach", help="live TUI for a job (or replay a recording)")
    attach.add_argument("target", nargs="?", help="job name, pid, socket path, recording file/dir, or host:port")
    attach.add_argument("--token", default=None, help="token for host:port (default: read from the token file)")
    attach.add_argument("--speed", type=float, default=1.0, help="replay speed for recordings")
    _hosts_options(attach, token=False)
    _price_option(attach)

    ls = sub.add_parser("ls", help="list live jobs of this user on this node")
    ls.add_argument("--json", action="store_true", help="print a JSON list")

    run = sub.add_parser("run", help="run CMD with zero-code instrumentation")
    run.add_argument("--record", default=None, metavar="DIR", help="record every rank to DIR")
    run.add_argument("--no-tui", action="store_true", help="do not open the TUI; pass output through")
    run.add_argument("--job", default=None, help="job name (default: the script's name)")
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ...")

    record = sub.add_parser("record", help="record a live job without a TUI")
    record.add_argument("target", nargs="?", help="job name, pid or socket path (default: the only job)")
    record.add_argument("-o", "--output", required=True, metavar="DIR", help="directory for the recording files")
    record.add_argument("--seconds", type=float, default=None,
                        help="stop after this long, counted once every rank or host has answered "
                             "(default: until the job ends)")
    _hosts_options(record)

    report = sub.add_parser("report", help="summary with the verdict, from a recording or a live job")
    report.add_argument("target", help="recording file or directory, or a live job (name, pid, socket)")
    report.add_argument("--json", action="store_true", help="print the report JSON (schema perfmon.report/2)")
    report.add_argument("--seconds", type=float, default=5.0,
                        help="for a live job: how long to gather, counted once every rank or host has answered")
    report.add_argument("--html", metavar="OUT.html", default=None,
                        help="also write the whole run as one self-contained HTML page (charts, offline)")
    _hosts_options(report)
    _price_option(report)

    compare = sub.add_parser("compare", help="two runs side by side: did the candidate regress, by how much, why "
                                             "(exit 1 past a limit)")
    compare.add_argument("baseline", help="recording file or directory, or a live job (name, pid, socket)")
    compare.add_argument("candidate", help="the run to judge against the baseline (same kinds)")
    compare.add_argument("--json", action="store_true", help="print the comparison JSON (schema perfmon.compare/1)")
    compare.add_argument("--max-regression", type=float, default=None, metavar="PCT",
                         help="exit 1 when the step time is significantly slower by more than PCT percent")
    compare.add_argument("--limit", action="append", default=None, metavar="NAME=VALUE",
                         help="exit 1 when NAME worsens by more than VALUE (points for shares such as "
                              "data_wait_frac, percent otherwise); repeatable")
    compare.add_argument("--min-change", type=float, default=10.0, metavar="PCT",
                         help="the least step-time change called a regression or an improvement (default 10)")
    compare.add_argument("--warmup", type=int, default=10, metavar="STEPS",
                         help="first steps of each run left out of everything compared (default 10)")
    compare.add_argument("--seconds", type=float, default=5.0, help="for a live job: how long to gather")

    profile = sub.add_parser("profile", help="time each module of a live job for a few steps: params, FLOPs, "
                                             "forward/backward time, achieved FLOP/s")
    profile.add_argument("target", nargs="?", help="job name, pid, socket path, or host:port (default: the only job)")
    profile.add_argument("--steps", type=int, default=5, help="steps to profile, 1..50 (default 5)")
    profile.add_argument("--depth", type=int, default=3, help="module tree depth, 0..8 (default 3)")
    profile.add_argument("--top", type=int, default=25, help="rows shown: the N modules with the most time")
    profile.add_argument("--rank", type=int, default=None, help="which rank (default: the lowest on this host)")
    profile.add_argument("--json", action="store_true", help="print the profile JSON (the report's `profile`)")
    profile.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the steps (default 120)")
    profile.add_argument("--token", default=None, help="token for host:port (default: read from the token file)")
    _hosts_options(profile, token=False)

    capture = sub.add_parser("capture", help="torch.profiler over the next N steps of a live job: a trace per "
                                             "rank and its top operators")
    capture.add_argument("target", nargs="?", help="job name, pid or socket path (default: the only job)")
    capture.add_argument("--steps", type=int, default=3, help="steps to capture, 1..20 (default 3)")
    capture.add_argument("--ranks", default=None, metavar="LIST", help="ranks to capture, e.g. 0,3 (default: all here)")
    capture.add_argument("--json", action="store_true", help="print the summaries as JSON")
    capture.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the steps (default 120)")
    _hosts_options(capture)

    export = sub.add_parser("export", help="a live job's metrics for Prometheus, or recordings as a Chrome trace")
    what = export.add_mutually_exclusive_group(required=True)
    what.add_argument("--prometheus", metavar="[HOST:]PORT", help="serve /metrics for JOB while it runs")
    what.add_argument("--trace", metavar="OUT.json", help="write the recordings as a Chrome/Perfetto trace")
    export.add_argument("targets", nargs="*", metavar="JOB|REC", help="the live job (--prometheus), or "
                        "recording files/directories (--trace)")
    export.add_argument("--steps", metavar="A:B", default=None, help="(--trace) slices for step numbers A to B-1, "
                        "either end open (default: the most recent 2000 steps; the counter covers every step)")
    _hosts_options(export)

    inject = sub.add_parser("inject", help="start the probe inside a running Python job (no restart; "
                                           "sys.remote_exec or ptrace)")
    inject.add_argument("pid", type=int, nargs="?", help="a training process, or a torchrun launcher (every "
                                                         "worker here)")
    inject.add_argument("--job", default=None, metavar="NAME",
                        help="instead of a PID: every process of the job named NAME on this node (its script's "
                             "name: train for train.py), or on each host given below; the probes serve it as NAME")
    inject.add_argument("--timeout", type=float, default=60.0,
                        help="seconds to wait for a training step to start the probe (default 60)")
    inject.add_argument("--attach", action="store_true", help="open the TUI on the job once its probe is up")
    _method_option(inject)
    _hosts_options(inject, relays=False)

    detach = sub.add_parser("detach", help="remove everything `perfmon inject` put into a process")
    detach.add_argument("pid", type=int, nargs="?", help="the process (or torchrun launcher) given to perfmon inject")
    detach.add_argument("--job", default=None, metavar="NAME",
                        help="instead of a PID: every process of the job named NAME here, or on each host given below")
    _method_option(detach)
    _hosts_options(detach, relays=False)

    relay = sub.add_parser("relay", help="(started by a viewer through ssh) this node's ranks of JOB as one stream")
    relay.add_argument("job", help="job name")
    how = relay.add_mutually_exclusive_group()
    how.add_argument("--stdio", action="store_true", help="speak the wire protocol on stdin/stdout")
    how.add_argument("--tcp", metavar="[HOST:]PORT", help="serve one viewer on TCP (127.0.0.1 by default) that "
                     "sends the token ($PERFMON_TOKEN, else a new one in a 0600 file)")
    group = relay.add_argument_group("a group relay: the middle of a relay tree (docs/tree.md)")
    group.add_argument("--nodes", default=None, metavar="LIST", help="reduce the ranks of these nodes' relays "
                       "(SLURM syntax allowed) rather than this node's ranks")
    group.add_argument("--nodes-via", default=None, metavar="TEMPLATE", help="transport to the nodes, "
                       "percent-encoded (default: $PERFMON_VIA, else ssh)")
    group.add_argument("--relay-port", type=int, default=None, metavar="PORT",
                       help="connect to 'perfmon relay --tcp PORT JOB' on each node (token: $PERFMON_TOKEN)")
    group.add_argument("--relay-argv", default=None, help=argparse.SUPPRESS)   # the node relay's command, comma-joined
    group.add_argument("--group", default=None, metavar="NAME", help="the group's name (default: its first node)")
    group.add_argument("--prometheus", default=None, metavar="[HOST:]PORT",
                       help="serve the group's numbers on /metrics (per group and its worst ranks only)")

    doctor = sub.add_parser("doctor", help="check that perfmon measures and diagnoses correctly on this machine")
    doctor.add_argument("--cpu-only", action="store_true", help="skip the GPU checks even when a GPU is present")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    try:
        module = importlib.import_module(COMMANDS[args.command])
        return int(module.main(args) or 0)
    except UserError as exc:
        print(f"perfmon {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `perfmon ls | head`
        return 0


if __name__ == "__main__":
    sys.exit(main())
