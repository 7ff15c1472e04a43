"""``perfmon run [--record DIR] [--no-tui] [--job NAME] -- CMD ...``: zero-code instrumentation.

CMD runs with ``probe/autostart`` first on ``PYTHONPATH`` (chained to any
existing entries), so every Python process of the job (python, torchrun and its
workers, a shell script's python) loads ``probe.autostart.sitecustomize`` and,
once it trains, streams like a script that called ``probe.start()``. The job
gets its own process group: SIGINT, SIGTERM and SIGHUP sent to perfmon are
forwarded to the whole group once, as a terminal delivers Ctrl-C, and perfmon
exits with CMD's exit code (128+N if signal N killed it). With ``--no-tui`` in a
terminal the job's group is the terminal's foreground group, so Ctrl-C, Ctrl-Z
and interactive input (pdb) work as if perfmon were not there.

With the TUI the job's stdout/stderr go to a log file (readable in the TUI,
path printed at exit) so its output never tears the screen; with ``--no-tui``
or without a terminal they pass through unchanged. This module never imports torch.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from probe import paths
from tui.errors import UserError

AUTOSTART_DIR = Path(__file__).resolve().parents[2] / "probe" / "autostart"
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
LAUNCHERS = ("torch.distributed.run", "torch.distributed.launch")
TAIL_POLL = 0.2


def job_name(cmd: list[str]) -> str:
    """Default job name: the training script's name (``train`` for ``torchrun ... train.py``)."""
    for i, arg in enumerate(cmd):
        if arg == "-m" and i + 1 < len(cmd) and cmd[i + 1] not in LAUNCHERS:
            return paths.safe_job(cmd[i + 1].rsplit(".", 1)[-1])
        if arg.endswith((".py", ".sh")) and not arg.startswith("-"):
            return paths.safe_job(Path(arg).stem)
    return paths.safe_job(Path(cmd[0]).name)


def job_env(base: dict[str, str], *, job: str, record: Path | None, unbuffered: bool) -> dict[str, str]:
    """The environment that makes every Python process of the job load the dormant probe."""
    env = dict(base)
    existing = base.get("PYTHONPATH")
    env["PYTHONPATH"] = str(AUTOSTART_DIR) + (os.pathsep + existing if existing else "")
    env["PERFMON_AUTO"] = "1"
    env["PERFMON_JOB"] = job
    if record is not None:
        env["PERFMON_RECORD"] = str(record)
    if unbuffered:
        env.setdefault("PYTHONUNBUFFERED", "1")   # the TUI's log view follows the file as lines are written
    return env


def exit_code(returncode: int) -> int:
    """CMD's exit status as a shell reports it: 128+N when signal N ended it."""
    return 128 - returncode if returncode < 0 else returncode


def _record_dir(record: str | None) -> Path | None:
    if not record:
        return None
    path = Path(record).expanduser().resolve()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create the recording directory {path}: {exc.strerror or exc}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UserError(f"cannot write to the recording directory {path}")
    return path


def _log_file(job: str, record: Path | None) -> tuple[int, Path]:
    directory = str(record) if record is not None else tempfile.gettempdir()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    fd, name = tempfile.mkstemp(prefix=f"perfmon-{job}-{stamp}-", suffix=".log", dir=directory)
    return fd, Path(name)


def _tui_runner(no_tui: bool) -> Callable[..., int] | None:
    """``tui.app.launch.run_tui`` when the TUI can open here; None (with one line saying why) otherwise."""
    if no_tui:
        return None
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        _say("no terminal for the TUI; running as with --no-tui (output passes through)")
        return None
    try:
        from tui.app.launch import run_tui
    except ImportError as exc:
        _say(f"the TUI cannot start ({exc}); running as with --no-tui")
        return None
    return run_tui


def _foreground_terminal() -> int | None:
    """stdin's fd when it is our controlling terminal and we are its foreground job, else None."""
    try:
        fd = sys.stdin.fileno()
        return fd if os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp() else None
    except (OSError, ValueError, AttributeError):
        return None


def _say(message: str) -> None:
    try:
        print(f"perfmon run: {message}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


class Job:
    """CMD in its own process group, with SIGINT/SIGTERM/SIGHUP forwarded to that group.

    With ``terminal`` (the fd of perfmon's controlling terminal, ``--no-tui`` in the
    foreground) the job's group becomes the terminal's foreground group, as a shell
    does for a foreground job: Ctrl-C, Ctrl-Z and reads from the terminal (pdb,
    input()) reach the job directly, and perfmon forwards only signals sent to it.
    """

    def __init__(self, cmd: list[str], env: dict[str, str], *, output: int | None, stdin: Any,
                 terminal: int | None = None) -> None:
        self.terminal = terminal
        self._early: list[int] = []
        self._previous = {sig: signal.signal(sig, self._forward) for sig in FORWARDED}
        kwargs: dict[str, Any] = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
        try:
            self.proc: subprocess.Popen = subprocess.Popen(cmd, env=env, stdin=stdin, stdout=output, stderr=output,
                                                           **kwargs)
        except OSError as exc:
            self._restore()
            if isinstance(exc, FileNotFoundError):
                raise UserError(f"{cmd[0]}: command not found") from None
            if isinstance(exc, PermissionError):
                raise UserError(f"{cmd[0]}: permission denied (not executable?)") from None
            raise UserError(f"cannot start {cmd[0]}: {exc.strerror or exc}") from None
        if terminal is not None:
            self._foreground(self.proc.pid)
        for signum in self._early:            # arrived while the job was starting
            self._forward(signum, None)

    def _forward(self, signum: int, frame: Any) -> None:
        """Deliver the signal once to every process of the job (torchrun passes it on to its workers)."""
        proc = getattr(self, "proc", None)        # not set yet while Popen starts it
        if proc is None:
            self._early.append(signum)
            return
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:
            pass

    def _foreground(self, pgid: int) -> None:
        if self.terminal is None:
            return
        previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)   # we may be in the background right now
        try:
            os.tcsetpgrp(self.terminal, pgid)
        except OSError:
            pass
        finally:
            signal.signal(signal.SIGTTOU, previous)

    def forward_signals(self) -> None:
        """(Re)install the forwarding handlers; the TUI's event loop resets them when it closes."""
        for sig in FORWARDED:
            signal.signal(sig, self._forward)

    def _restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def wait(self) -> int:
        """Wait for CMD's exit and return its status as Popen reports it."""
        try:
            if self.terminal is None:
                return self.proc.wait()
            return self._wait_in_foreground()
        finally:
            if self.terminal is not None:
                self._foreground(os.getpgrp())
            self._restore()

    def _wait_in_foreground(self) -> int:
        proc = self.proc
        assert proc is not None
        if proc.returncode is not None:
            return proc.returncode
        while True:
            _, status = os.waitpid(proc.pid, os.WUNTRACED)
            if not os.WIFSTOPPED(status):
                proc.returncode = os.waitstatus_to_exitcode(status)
                return proc.returncode
            if os.WSTOPSIG(status) in (signal.SIGTSTP, signal.SIGSTOP):
                # Ctrl-Z: stop too, so the shell gets the terminal back; `fg` continues us here
                self._foreground(os.getpgrp())
                os.kill(os.getpid(), signal.SIGSTOP)
            self._foreground(proc.pid)         # resumed, or the job read the terminal before it was handed over
            os.killpg(proc.pid, signal.SIGCONT)


def _follow(log_path: Path, job: Job) -> None:
    """After the TUI closed on a running job: pass the job's new output through until it ends."""
    try:
        with log_path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            while True:
                done = job.proc.poll() is not None
                chunk = fh.read(1 << 16)
                if chunk:
                    sys.stdout.buffer.write(chunk)
                    sys.stdout.buffer.flush()
                elif done:
                    return
                else:
                    time.sleep(TAIL_POLL)
    except (OSError, ValueError):
        return


def main(args: Any) -> int:
    cmd = list(args.cmd or [])
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UserError("nothing to run: perfmon run [--record DIR] [--no-tui] [--job NAME] -- CMD ...")
    if not (AUTOSTART_DIR / "sitecustomize.py").is_file():
        raise UserError(f"zero-code start-up file missing: {AUTOSTART_DIR / 'sitecustomize.py'} (broken install?)")
    job_label = paths.safe_job(args.job) if args.job else job_name(cmd)
    record = _record_dir(args.record)
    run_tui = _tui_runner(args.no_tui)
    env = job_env(dict(os.environ), job=job_label, record=record, unbuffered=run_tui is not None)

    if run_tui is None:
        job = Job(cmd, env, output=None, stdin=None, terminal=_foreground_terminal())
        rc = exit_code(job.wait())
    else:
        log_fd, log_path = _log_file(job_label, record)
        try:
            job = Job(cmd, env, output=log_fd, stdin=subprocess.DEVNULL)
        finally:
            os.close(log_fd)
        waiter = threading.Thread(target=job.proc.wait, name="perfmon-run-wait", daemon=True)
        waiter.start()
        try:
            run_tui(job_label, log_path, on_signal=lambda signum: job._forward(signum, None))
        except UserError as exc:
            _say(f"TUI closed: {exc}")
        finally:
            job.forward_signals()
        if job.proc.poll() is None:
            _say(f"TUI closed; job {job_label} still running (pid {job.proc.pid}); its output follows "
                 "(Ctrl-C stops it)")
            _follow(log_path, job)
        rc = exit_code(job.wait())
        _say(f"job output: {log_path}")
    if record is not None:
        _write_exit(record, job_label, cmd, job.proc.returncode)
        _say(f"recordings: {record}  (perfmon report {record})")
    return rc


def _write_exit(record: Path, job: str, cmd: list[str], returncode: int | None) -> None:
    """Leave how the command ended beside its recordings (when it trained: a job that left no
    recording leaves nothing): a non-zero exit is the report's verdict even when no process recorded
    an exception (``perfmon_analysis.crash``)."""
    from probe.recording import recording_files
    from tui.stream.sources import exit_path

    if not recording_files(record):
        return
    try:
        exit_path(record, job, os.getpid()).write_text(json.dumps(
            {"job": job, "cmd": cmd[:32], "returncode": returncode, "t": time.time()}))
    except OSError as exc:
        _say(f"could not write the exit status beside the recordings: {exc.strerror or exc}")
