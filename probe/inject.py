"""The probe inside a process that ``perfmon inject`` entered, and its removal by ``perfmon detach``.

``perfmon inject PID`` runs ``BOOT`` in the target (``tui/injector.py``): through
``sys.remote_exec`` (Python 3.14+, PEP 768) as the file ``entry_script`` writes, which the
target's main thread runs at its next safe point, or through ptrace, on a thread parked in the
kernel. The code it runs there only starts a thread (``perfmon-inject``) and returns, so the
borrowed thread is held briefly and takes no lock perfmon needs. That thread
puts perfmon's installation on ``sys.path`` just long enough to import ``probe`` and the
packages the probe needs (``DEPENDENCIES``), then calls ``install()`` here: zero-code mode's
dormant hooks (``probe.auto``), which start the probe and its socket at the next optimizer step.
``perfmon detach PID`` asks the probe over its socket (``detach_request``), or, while it is
still dormant (no socket yet), runs ``BOOT`` again; both call ``detach()``: the probe is closed,
every hook and wrapper is taken out, its threads are joined and its modules leave ``sys.modules``.
The socket is preferred: code run through ptrace runs inside ``dlopen`` holding the dynamic
loader's lock, and a probe thread holding the GIL that needs that lock (a C++ ``thread_local``'s
first use) would deadlock with it.

Each run answers with one JSON object written to the file the command named (``{"ok": bool,
"message": str, ...}``). Nothing here raises into the target; a failure half-way undoes what
was done. Python cannot unregister ``os.register_at_fork`` callbacks: the probe's stay registered,
disarmed (``probe.forks``), holding nothing of perfmon.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import threading
import time
from typing import Any

DEPENDENCIES = ("msgpack", "psutil", "pynvml")   # third-party modules the probe imports, from perfmon's installation
STAYS_IMPORTED = ("pynvml",)                      # left loaded by detach (``_remove_modules``)
THREAD_PREFIX = "perfmon-"
JOIN_SECONDS = 3.0

# Run through ``exec`` on the interrupted thread, in a namespace of its own (nothing is bound in
# the target's ``__main__``); ``ARGS`` holds action, paths, result, job. Only the standard library here.
# Entered through ptrace, that thread runs this inside ``dlopen``, holding the dynamic loader's lock,
# and needs the GIL back after ``start()``: ``perfmon-inject`` waits until it has left this code
# before anything of its own can load a library (importing a C extension holds the GIL while it
# waits for that lock). Only built-in modules before that wait.
BOOT = r'''
import sys, threading, time

def _entered_thread_left(ident, seconds=30.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        frame = sys._current_frames().get(ident)
        while frame is not None and frame.f_globals.get("__name__") != "__perfmon_inject__":
            frame = frame.f_back
        if frame is None:
            return
        time.sleep(0.001)

def _boot(args, entered):
    _entered_thread_left(entered)
    import json, os
    def answer(**fields):
        tmp = args["result"] + ".tmp"
        with open(tmp, "w") as f:
            json.dump(fields, f)
        os.replace(tmp, args["result"])
    try:
        if args["action"] == "detach":
            mod = sys.modules.get("probe.inject")
            if mod is None or not mod.installed():
                answer(ok=False, message="no probe injected by perfmon in this process")
            else:
                answer(**mod.detach())
            return
        if "torch" not in sys.modules:
            answer(ok=False, message="this process has not imported torch: nothing to measure")
            return
        if getattr(getattr(sys.modules["torch"], "__spec__", None), "_initializing", False):
            answer(ok=False, message="this process is still importing torch; try again once it trains")
            return
        if "probe" in sys.modules:
            ours = "probe.core" in sys.modules or "probe.auto" in sys.modules
            answer(ok=False, message="a perfmon probe is already in this process: perfmon attach it" if ours
                   else "this process has a module named 'probe' of its own: perfmon's cannot load beside it")
            return
        before = set(sys.modules)
        added = [p for p in args["paths"] if p not in sys.path]
        sys.path[:0] = added
        try:
            import probe.inject as mod
            for name in mod.DEPENDENCIES:
                __import__(name)
        except BaseException as exc:
            for name in set(sys.modules) - before:
                if name.split(".")[0] in ("probe", "msgpack", "psutil", "pynvml"):
                    del sys.modules[name]
            answer(ok=False, message=f"perfmon's probe cannot load here: {exc!r}")
            return
        finally:
            for p in added:
                sys.path.remove(p)
        answer(**mod.install(before, args.get("job")))
    except BaseException as exc:
        try:
            answer(ok=False, message=f"injected code failed: {exc!r}")
        except BaseException:
            pass

threading.Thread(target=_boot, args=(ARGS, threading.get_ident()), name="perfmon-inject", daemon=True).start()
'''

# The file ``sys.remote_exec`` has the target's main thread run (in a fresh namespace), whenever it
# reaches a safe point. Unlinking WANTED is its claim; the command unlinks it when it gives up
# waiting, so exactly one of the two succeeds: a file that runs after the command gave up removes
# its directory and does nothing else. Exceptions must not escape (CPython prints them on the
# target's stderr); KeyboardInterrupt and SystemExit are the target's own and pass through.
ENTRY = r'''
import os
try:
    os.unlink(WANTED)
except OSError:
    try:
        for name in os.listdir(DIRECTORY):
            os.unlink(os.path.join(DIRECTORY, name))
        os.rmdir(DIRECTORY)
    except OSError:
        pass
else:
    try:
        STATEMENT
    except Exception as exc:
        try:
            import json
            with open(RESULT + ".tmp", "w") as f:
                json.dump({"ok": False, "message": f"injected code failed: {exc!r}"}, f)
            os.replace(RESULT + ".tmp", RESULT)
        except OSError:
            pass
'''

_before: set[str] = set()        # sys.modules before the injection: what detach must leave
_installed = False


def payload(action: str, paths: list[str], result: str, job: str | None = None) -> str:
    """The one statement run in the target: ``BOOT`` in a namespace of its own. ``job``: the name
    the probe will serve the job under (None: the default, the script's name)."""
    args = {"action": action, "paths": paths, "result": result, "job": job}
    return f"exec({BOOT!r}, {{'__name__': '__perfmon_inject__', 'ARGS': {args!r}}})"


def entry_script(action: str, paths: list[str], result: str, wanted: str, job: str | None = None) -> str:
    """The file run in the target through ``sys.remote_exec``: ``payload``'s statement, run only
    when it claims ``wanted`` (a file beside it, in the directory it removes when it cannot)."""
    head = f"WANTED = {wanted!r}\nDIRECTORY = {os.path.dirname(wanted)!r}\nRESULT = {result!r}\n"
    return head + ENTRY.replace("STATEMENT", payload(action, paths, result, job))


def installed() -> bool:
    return _installed


def install(before: set[str], job: str | None = None) -> dict[str, Any]:
    """Put zero-code mode's dormant hooks in place in this running process (the probe they start
    names the job ``job``, else the script's name)."""
    global _before, _installed
    _before = before
    try:
        from probe import auto, lifecycle
        if lifecycle.current() is not None or auto.active():
            _remove_modules()
            return {"ok": False, "message": "a perfmon probe is already running in this process"}
        try:
            lifecycle.socket_path(job)
        except OSError as exc:      # the probe would start with no live view: nothing to wait for
            _remove_modules()
            return {"ok": False, "message": str(exc)}
        auto.install(optimizers=_optimizers(sys.modules["torch"]), job=job, running=True)
        if not auto.active():
            _remove_modules()
            return {"ok": False, "message": "zero-code mode is off in this process (PERFMON_DISABLE=1?)"}
    except BaseException as exc:
        detach()
        return {"ok": False, "message": f"perfmon's hooks could not be installed: {exc!r}"}
    _installed = True
    return {"ok": True, "message": "dormant hooks installed; the probe starts at the next optimizer step"}


def detach() -> dict[str, Any]:
    """Close the probe and take out everything perfmon added to this process."""
    global _installed
    left: list[str] = []
    steps = None
    gpu = None
    try:
        from probe import auto, fetches, forks, hooks, layout, tracing
        from probe.comm import collectives
        mon = auto._auto.probe if auto._auto is not None else None
        steps = mon.steps if mon is not None else 0
        gpu = mon.attached.gpu if mon is not None else None     # close() lets go of it
        left += auto.uninstall()
        fetches.uninstall()
        collectives.uninstall()
        layout.uninstall()
        hooks.unfilter_module_state()
        tracing.remove_finder()
        forks.disarm_all()
    except BaseException as exc:
        left.append(f"removal failed: {exc!r}")
    left += _join_threads()
    if gpu is not None:          # after the sampler thread is gone
        gpu.nvml.shutdown()
    _installed = False
    _remove_modules()
    message = "detached" if not left else "detached, except: " + "; ".join(left)
    return {"ok": not left, "message": message, "steps": steps, "left": left}


def detach_request(result: Any) -> str | None:
    """A viewer's ``detach`` request (sender thread): None when accepted, else why not. The removal
    runs on a thread of its own (it stops the sender) and writes its outcome to ``result``."""
    if not _installed:
        from probe.requests import NOT_INJECTED
        return NOT_INJECTED
    if not isinstance(result, str) or not os.path.isabs(result):
        return "detach needs the absolute path of a result file"
    threading.Thread(target=_detach_to, args=(result,), name="perfmon-detach", daemon=True).start()
    return None


def _detach_to(result: str) -> None:
    outcome = detach()
    try:
        tmp = result + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(outcome, f)
        os.replace(tmp, result)
    except OSError:
        pass


def _optimizers(torch: Any) -> list[Any]:
    """The optimizers this process already built (the hooks cannot see them being built)."""
    cls = torch.optim.Optimizer
    # no __class__ lookups: some objects warn on them
    return [obj for obj in gc.get_objects() if issubclass(type(obj), cls)]


def _join_threads() -> list[str]:
    """Wait (bounded) for the probe's threads; name any still running."""
    deadline = time.monotonic() + JOIN_SECONDS
    me = threading.current_thread()
    for thread in threading.enumerate():
        if thread is not me and thread.name.startswith(THREAD_PREFIX):
            thread.join(max(0.0, deadline - time.monotonic()))
    return [f"thread {t.name} still running" for t in threading.enumerate()
            if t is not me and t.name.startswith(THREAD_PREFIX) and t.is_alive()]


def _remove_modules() -> None:
    """Forget the modules the injection loaded (the probe's and its dependencies'), not the target's.
    pynvml stays imported: ctypes caches the pointer and array types of its structures for the life
    of the process, so each unload would leave its classes behind and each injection add a copy."""
    ours = tuple(name for name in ("probe",) + DEPENDENCIES if name not in STAYS_IMPORTED)
    for name in list(sys.modules):
        if name.split(".")[0] in ours and name not in _before:
            sys.modules.pop(name, None)
