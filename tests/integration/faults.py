"""The fault suite, sized by its arguments: CI sizes in tests/integration/test_faults.py,
the long runs in bench/bench_faults.py. Each function returns a dict of figures; the callers assert.
"""

from __future__ import annotations

import json
import os
import random
import selectors
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.helpers.cli import perfmon

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "integration" / "jobs" / "fault_jobs.py"


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(extra)
    return env


# -- 1. kill -9 at random points ----------------------------------------------------------------

def kill9(points: int, seed: int = 1, max_delay: float = 0.8, report_every: int = 1,
          subprocess_report: bool = True) -> dict[str, Any]:
    """Start a recording job ``points`` times and SIGKILL it at a uniformly random moment
    (0..max_delay s after the spawn: start-up, mid-write, mid-sample, mid-event);
    every file must read back as an intact prefix (steps 0..n-1, any step the probe dropped announced
    by a ``drops`` record, then clean or a torn tail,
    never "corrupt"), and ``perfmon report`` must answer on it (a report, or one clear line
    when the kill came before the first step record)."""
    rng = random.Random(seed)
    out = Path(tempfile.mkdtemp(prefix="perfmon-kill9-"))
    figures = {"points": points, "files": 0, "torn_tail": 0, "clean": 0, "corrupt": 0, "bad_prefix": 0,
               "report_ok": 0, "report_one_line": 0, "report_failed": 0, "steps_total": 0, "failures": []}
    try:
        for i in range(points):
            d = out / f"k{i}"
            proc = subprocess.Popen([sys.executable, str(JOB), "record", str(d)], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, env=_env())
            # the random point, from the spawn: start-up, first records, steady stepping, samples, events
            # (a delay is the very thing varied here, not a stand-in for synchronization)
            try:
                time.sleep(rng.uniform(0.0, max_delay))
            finally:                              # also when this run is interrupted: no orphan job
                proc.send_signal(signal.SIGKILL)
                proc.wait()
            _check_killed_file(d, figures, run_report=(i % report_every == 0), subprocess_report=subprocess_report)
            shutil.rmtree(d, ignore_errors=True)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return figures


def _report_in_process(path: str) -> subprocess.CompletedProcess:
    """``perfmon report PATH --json`` through the CLI's own ``main`` in this process (no interpreter
    start-up per file: 1,000 reports fit in the bench's time)."""
    import contextlib
    import io

    from tui import cli
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli.main(["report", path, "--json"])
        except BaseException as exc:    # a traceback is a failure of the promise, counted by the caller
            import traceback
            err.write("Traceback (most recent call last):\n" + "".join(traceback.format_exception(exc)))
            rc = 1
    return subprocess.CompletedProcess(["perfmon", "report", path], rc, out.getvalue(), err.getvalue())


def _intact_prefix(records: list[dict[str, Any]]) -> bool:
    """The hello first, then steps 0, 1, 2, ... where every number skipped is announced before the
    next step by ``drops`` records (the job outran its sender: the probe drops and says so, it
    never blocks the training loop)."""
    if records and records[0]["k"] != "hello":
        return False
    expected, announced = 0, 0
    for r in records:
        if r["k"] == "drops":
            announced += r["count"]
        elif r["k"] == "step":
            skipped = r["step"] - expected
            if skipped < 0 or skipped > announced:
                return False
            announced -= skipped
            expected = r["step"] + 1
    return True


def _check_killed_file(d: Path, figures: dict[str, Any], run_report: bool, subprocess_report: bool) -> None:
    from probe.recording import read_recording
    files = sorted(d.glob("*.pmrec"))
    for path in files:
        figures["files"] += 1
        figures.setdefault("bytes", []).append(path.stat().st_size)
        result = read_recording(path)
        if result.problem == "corrupt":
            figures["corrupt"] += 1
            figures["failures"].append(result.message)
        elif result.problem == "truncated":
            figures["torn_tail"] += 1
        else:
            figures["clean"] += 1
        steps = [r["step"] for r in result.records if r["k"] == "step"]
        figures["steps_total"] += len(steps)
        if not _intact_prefix(result.records):
            figures["bad_prefix"] += 1
            figures["failures"].append(f"{path}: not an intact prefix")
        if not run_report:
            continue
        rep = (perfmon("report", str(path), "--json", env=_env(), cwd="/") if subprocess_report
               else _report_in_process(str(path)))
        if rep.returncode == 0 and json.loads(rep.stdout)["schema"] == "perfmon.report/2":
            figures["report_ok"] += 1
        elif rep.returncode != 0 and len(rep.stderr.strip().splitlines()) <= 2 and "Traceback" not in rep.stderr \
                and not steps:
            figures["report_one_line"] += 1
        else:
            figures["report_failed"] += 1
            figures["failures"].append(f"{path}: report rc={rep.returncode} {rep.stderr[-300:]}")


# -- 2. DataLoader worker forks with viewers attached ------------------------------------------

def forks(method: str, workers: int, viewers: int = 2, timeout: float = 600) -> dict[str, Any]:
    """A job starts ``workers`` DataLoader workers (2 per epoch) with ``method`` while ``viewers``
    viewers read its socket; every worker calls the probe API (its own disabled probe and the
    parent's copied one). No hang (timeout), and each viewer sees one hello (the parent's pid),
    contiguous steps and a bye: nothing from a child."""
    from probe import wire
    sock_dir = Path(tempfile.mkdtemp(prefix="perfmon-forks-"))
    os.chmod(sock_dir, 0o700)
    env = _env(PERFMON_DIR=str(sock_dir))
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, str(JOB), "forks", method, str(workers)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    path = proc.stdout.readline().strip()
    conns = []
    for _ in range(viewers):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        s.sendall(wire.encode({"k": "hello", "t": time.time(), "proto": list(wire.PROTO)}))
        conns.append(s)
    proc.stdin.write("go\n")
    proc.stdin.flush()
    streams = _read_all(conns, timeout)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return {"hang": True, "stderr": err[-2000:]}
    shutil.rmtree(sock_dir, ignore_errors=True)
    summary = json.loads(out.strip().splitlines()[-1]) if proc.returncode == 0 else {}
    figures: dict[str, Any] = {"hang": False, "rc": proc.returncode, "seconds": round(time.monotonic() - t0, 1),
                               "method": method, **summary, "stderr": err[-2000:] if proc.returncode else ""}
    bad = []
    for records in streams:
        hellos = [r for r in records if r["k"] == "hello"]
        steps = [r["step"] for r in records if r["k"] == "step"]
        foreign = [r for r in records if r["k"] == "event" and r.get("name") == "from-a-worker"]
        if len(hellos) != 1 or hellos[0]["pid"] != proc.pid or steps != list(range(len(steps))) or foreign \
                or not records or records[-1]["k"] != "bye" or len(steps) != summary.get("steps"):
            bad.append({"hellos": len(hellos), "steps": len(steps), "foreign": len(foreign)})
    figures["viewers_bad"] = bad
    return figures


def _read_all(conns: list[socket.socket], timeout: float) -> list[list[dict]]:
    from probe import wire
    sel = selectors.DefaultSelector()
    decoders = {}
    out: dict[int, list[dict]] = {}
    for s in conns:
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
        decoders[s.fileno()] = wire.FrameDecoder()
        out[s.fileno()] = []
    open_n = len(conns)
    deadline = time.monotonic() + timeout
    while open_n and time.monotonic() < deadline:
        for key, _ in sel.select(0.5):
            s = key.fileobj
            try:
                data = s.recv(1 << 16)
            except BlockingIOError:
                continue
            if not data:
                sel.unregister(s)
                open_n -= 1
                continue
            out[s.fileno()].extend(decoders[s.fileno()].feed(data))
    order = [out[s.fileno()] for s in conns]
    for s in conns:
        s.close()
    sel.close()
    return order


# -- 3. viewer storm --------------------------------------------------------------------------

def storm(cycles: int, stalled: int, block_seconds: float = 3.0, blocks: int = 3) -> dict[str, Any]:
    """Step-time p99 of a training loop in alternating blocks: quiet, storm, quiet, storm...
    (the storm: ``cycles`` connect/hello/disconnect cycles spread over the storm blocks, plus
    ``stalled`` viewers that connect and never read). Ratio = median p99 of storm blocks /
    median p99 of quiet blocks; the noise reference is the spread of the quiet blocks' p99.
    Afterwards the job's fd count and RSS are compared with those before the first storm."""
    from probe import wire
    sock_dir = Path(tempfile.mkdtemp(prefix="perfmon-storm-"))
    os.chmod(sock_dir, 0o700)
    proc = subprocess.Popen([sys.executable, str(JOB), "storm", str(block_seconds)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(PERFMON_DIR=str(sock_dir)),
                            text=True)
    path = proc.stdout.readline().strip()

    def say(label: str) -> None:
        proc.stdin.write(label + "\n")
        proc.stdin.flush()

    hello = wire.encode({"k": "hello", "t": time.time(), "proto": list(wire.PROTO)})
    say("warm-up")                 # the backfill buffers fill up first: the baseline is a running job
    proc.stdout.readline()
    say("measure-base-before")
    proc.stdout.readline()
    done_cycles = 0
    refused = 0
    per_block = max(1, cycles // blocks)
    stalled_socks: list[socket.socket] = []
    for b in range(blocks):
        say(f"quiet-{b}")
        proc.stdout.readline()
        say(f"storm-{b}")
        if True:                  # every storm block: new stalled viewers, closed at its end
            for _ in range(stalled):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                s.connect(path)
                s.sendall(hello)
                stalled_socks.append(s)
        target = done_cycles + per_block
        t_end = time.monotonic() + block_seconds
        while done_cycles < target and time.monotonic() < t_end + 30:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(path)
                s.sendall(hello)
            except OSError:
                refused += 1
            finally:
                s.close()
            done_cycles += 1
        proc.stdout.readline()
        for s in stalled_socks:
            s.close()
        stalled_socks = []
        say(f"measure-base-after-{b}")
        proc.stdout.readline()
    say("measure-base-after")     # the job first waits (<= 10 s) until its sender closed every viewer
    proc.stdout.readline()
    say("end")
    out, err = proc.communicate(timeout=60)
    shutil.rmtree(sock_dir, ignore_errors=True)
    res = json.loads(out.strip().splitlines()[-1])

    def p99(label: str) -> float:
        return res[label]["p99"]

    quiet = [p99(f"quiet-{b}") for b in range(blocks)]
    stormy = [p99(f"storm-{b}") for b in range(blocks)]
    before, after = res["measure-base-before"], res["measure-base-after"]
    rss_blocks = [res[f"measure-base-after-{b}"]["rss_trimmed_kib"] for b in range(blocks)]
    return {"cycles": done_cycles, "cycles_refused_or_failed": refused, "stalled": stalled,
            "p99_quiet_us": [round(x * 1e6, 1) for x in quiet], "p99_storm_us": [round(x * 1e6, 1) for x in stormy],
            "ratio": round(statistics.median(stormy) / statistics.median(quiet), 3),
            "quiet_spread": round(max(quiet) / min(quiet), 3),
            "steps": sum(res[f"{k}-{b}"]["steps"] for k in ("quiet", "storm") for b in range(blocks)),
            "fds_before": before["fds"], "fds_after": after["fds"],
            "rss_before_kib": before["rss_kib"], "rss_after_kib": after["rss_kib"],
            "rss_trimmed_before_kib": before["rss_trimmed_kib"], "rss_trimmed_after_kib": after["rss_trimmed_kib"],
            "rss_trimmed_after_each_storm_kib": rss_blocks, "viewers_after": after["viewers"], "rc": proc.returncode}


# -- 5. another user ---------------------------------------------------------------------------

# What the other user's perfmon imports on the refused paths (report, ls, record): our two packages and
# msgpack (its pure-Python fallback loads where the copied C extension does not fit the interpreter).
CLIENT_PACKAGES = ("probe", "perfmon_analysis", "tui", "msgpack")
_SHOW_PREFIX = "import sys; print(sys.prefix, sys.version_info >= (3, 10))"


def _as_user(user: str, cmd: list[str]) -> list[str]:
    group = "nogroup" if user == "nobody" else user
    return ["setpriv", f"--reuid={user}", f"--regid={group}", "--clear-groups", "--", *cmd]


def other_user_python(user: str = "nobody") -> str | None:
    """An interpreter ``user`` runs as we do: the venv's base interpreter, else the system's python3.

    The venv itself may sit in a checkout ``user`` cannot read (a clone in a 0700 home), and a base
    interpreter under such a home (pyenv in /root) may start for ``user`` on some other stdlib; so a
    candidate counts only when ``user`` sees the same installation (``sys.prefix``) as we do. None when
    no candidate does."""
    candidates = [os.path.realpath(getattr(sys, "_base_executable", sys.executable)),
                  shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")]
    for python in dict.fromkeys(c for c in candidates if c):
        cmd = [python, "-I", "-c", _SHOW_PREFIX]
        try:
            ours = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd="/")
            theirs = subprocess.run(_as_user(user, cmd), capture_output=True, text=True, timeout=60, cwd="/")
        except OSError:
            continue
        if ours.returncode == theirs.returncode == 0 and ours.stdout == theirs.stdout \
                and ours.stdout.split()[-1] == "True":
            return python
    return None


def _readable_copy(lib: Path) -> None:
    """``CLIENT_PACKAGES`` as this interpreter imports them, copied into ``lib`` with directories 0755
    and files 0644: the other user's perfmon, whatever the mode of the checkout and venv."""
    import importlib
    for name in CLIENT_PACKAGES:
        package = Path(importlib.import_module(name).__file__).parent
        shutil.copytree(package, lib / name, ignore=shutil.ignore_patterns("__pycache__"))
    for path in [lib, *lib.rglob("*")]:
        os.chmod(path, 0o755 if path.is_dir() else 0o644)


def other_user(user: str = "nobody") -> dict[str, Any]:
    """As root, start a job that serves a socket and writes a recording, both where the probe itself
    makes them; then run perfmon as ``user`` against its socket, its job name and its recording: each
    refused with one line naming what was refused, nothing of the job shown.

    The other user runs the real ``perfmon`` (``tui.cli:main``) with an interpreter it can read
    (``other_user_python``) on a world-readable copy of the packages it imports, so the refusal under
    test is the job's own (its socket directory and socket, its recording's mode), never the checkout's:
    a clone in a 0700 directory passes as a world-readable one does. A control proves that client works:
    the same command reads a copy of the recording made readable for it. Then the two directories are
    opened to others (0711 / 0755): the socket's and the recording's own modes must still refuse."""
    python = other_user_python(user)
    if python is None:
        raise RuntimeError(f"no interpreter that {user} can run (tried the venv's base and python3)")
    base = Path(tempfile.mkdtemp(prefix="perfmon-user-"))
    os.chmod(base, 0o755)
    lib, sock_dir, rec_dir, home = base / "lib", base / "sock", base / "rec", base / "home"
    _readable_copy(lib)
    home.mkdir()
    os.chmod(home, 0o1777)                              # like /tmp: the other user may write there
    proc = subprocess.Popen([sys.executable, str(JOB), "storm", "0.2"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=_env(PERFMON_DIR=str(sock_dir), PERFMON_RECORD=str(rec_dir)), text=True)
    client = [python, "-I", "-c", f"import sys; sys.path.insert(0, {str(lib)!r}); "
                                  "from tui.cli import main; sys.exit(main(sys.argv[1:]))"]
    # the other user's own socket directory does not exist: nothing of theirs is in the way
    user_env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "PERFMON_DIR": str(home / "perfmon")}

    def run(*args: str, **env: str) -> dict[str, Any]:
        r = subprocess.run(_as_user(user, [*client, *args]), capture_output=True, text=True, timeout=60,
                           env={**user_env, **env}, cwd="/")
        return {"rc": r.returncode, "stdout": r.stdout.strip(), "stderr": r.stderr.strip()}

    results: dict[str, Any] = {}
    try:
        path = proc.stdout.readline().strip()
        proc.stdin.write("quiet-0\n")
        proc.stdin.flush()
        proc.stdout.readline()
        recordings = sorted(rec_dir.glob("*.pmrec"))
        if not path or not recordings:
            _, err = proc.communicate("end\n", timeout=60)
            raise RuntimeError(f"the job serves no socket or writes no recording: {err[-2000:]}")
        rec_file = recordings[0]
        control = home / "control.pmrec"
        shutil.copyfile(rec_file, control)
        os.chmod(control, 0o644)
        shown = run("report", str(control), "--json")
        results["control"] = {"rc": shown["rc"], "stderr": shown["stderr"][-500:],
                              "schema": json.loads(shown["stdout"]).get("schema") if shown["rc"] == 0 else None}
        results["refused"] = {
            "report socket": (path, run("report", path, "--json")),
            "ls its directory": (str(sock_dir), run("ls", "--json", PERFMON_DIR=str(sock_dir))),
            "record socket": (path, run("record", path, "-o", str(home / "out"), "--seconds", "2")),
        }
        os.chmod(sock_dir, 0o711)                       # others may now reach the socket by its name
        os.chmod(rec_dir, 0o755)                        # and list the recordings
        results["refused"].update({
            "report socket, directory opened": (path, run("report", path, "--json")),
            "record socket, directory opened": (path, run("record", path, "-o", str(home / "out"),
                                                          "--seconds", "2")),
            "report recording dir": (str(rec_file), run("report", str(rec_dir), "--json")),
            "report recording file": (str(rec_file), run("report", str(rec_file), "--json")),
        })
        results["written by the other user"] = sorted(p.name for p in home.rglob("*") if p != control)
    finally:
        if proc.poll() is None:
            try:
                proc.communicate("end\n", timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(base, ignore_errors=True)
    return results


# -- 6. -W error runs ------------------------------------------------------------------------

def warnings_runs() -> dict[str, Any]:
    """The same deterministic CPU training loop without the probe, then with it under ``-W error``,
    ``PYTHONWARNINGS=error`` and with the SIMULATED CUDA sync counter under both."""
    from probe.recording import read_recording
    runs = {"plain": ([], {}, []), "probe -W error": (["-W", "error"], {}, ["--probe"]),
            "probe PYTHONWARNINGS=error": ([], {"PYTHONWARNINGS": "error"}, ["--probe"]),
            "probe+sim-cuda -W error": (["-W", "error"], {}, ["--probe", "--sim-cuda"]),
            "probe+sim-cuda PYTHONWARNINGS=error": ([], {"PYTHONWARNINGS": "error"}, ["--probe", "--sim-cuda"])}
    out: dict[str, Any] = {}
    started = {}
    for name, (flags, extra_env, args) in runs.items():      # the runs are independent: all at once
        rec = Path(tempfile.mkdtemp(prefix="perfmon-werror-"))
        sock_dir = Path(tempfile.mkdtemp(prefix="perfmon-werror-sock-"))
        os.chmod(sock_dir, 0o700)
        proc = subprocess.Popen([sys.executable, *flags, str(JOB), "train", *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True,
                                env=_env(FAULT_RECORD=str(rec), PERFMON_DIR=str(sock_dir), **extra_env))
        started[name] = (proc, rec, sock_dir)
    for name, (proc, rec, sock_dir) in started.items():
        stdout, stderr = proc.communicate(timeout=300)
        entry: dict[str, Any] = {"rc": proc.returncode, "stderr": stderr[-1500:]}
        if proc.returncode == 0:
            entry.update(json.loads(stdout.strip().splitlines()[-1]))
            files = sorted(rec.glob("*.pmrec"))
            if files:
                steps = [x for x in read_recording(files[0]).records if x["k"] == "step"]
                entry["steps_recorded"] = len(steps)
                entry["syncs"] = sorted({s.get("syncs") for s in steps}, key=str)
        out[name] = entry
        shutil.rmtree(rec, ignore_errors=True)
        shutil.rmtree(sock_dir, ignore_errors=True)
    return out
