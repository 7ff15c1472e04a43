"""perfmon zero-code mode: imported by Python at start-up in every process of a ``perfmon run`` job.

``perfmon run`` puts this file's directory first on ``PYTHONPATH`` and sets
``PERFMON_AUTO=1``. This module then (1) runs the ``sitecustomize`` it shadows,
if there is one, so the environment's own start-up code still runs, and (2)
waits for the process to import torch: only then is ``probe.auto`` imported and
its dormant hooks installed. A process that never imports torch (a shell
helper, a tool the script runs) costs one lookup per import and nothing else.
Nothing here may raise: a failure is one line on stderr and the job runs as if
perfmon were absent.
"""

import os
import sys

_HERE = os.path.dirname(os.path.realpath(__file__))
_ROOT = os.path.dirname(os.path.dirname(_HERE))   # the directory holding the ``probe`` package


def _say(message):
    try:
        sys.stderr.write(f"perfmon: {message}\n")
    except (OSError, ValueError):
        pass


def _chain_shadowed():
    """Import the next ``sitecustomize`` on sys.path (the one ours hides), as Python would have."""
    ours = sys.modules[__name__]     # this module, running
    saved = list(sys.path)
    try:
        sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.curdir) != _HERE]
        del sys.modules[__name__]
        import sitecustomize  # type: ignore[import-not-found]  # noqa: F401  (the shadowed one, further down the path)
    except ImportError as exc:
        if exc.name != "sitecustomize":
            _say(f"the job's own sitecustomize failed: {exc!r}")
    except Exception as exc:
        _say(f"the job's own sitecustomize failed: {exc!r}")
    finally:
        sys.path[:] = saved
        sys.modules[__name__] = ours


def _install_auto():
    """Called once torch's package has finished executing."""
    try:
        import importlib.util
        spec = importlib.util.find_spec("probe")
        if spec is None:
            sys.path.append(_ROOT)          # a job interpreter without perfmon installed
            spec = importlib.util.find_spec("probe")
        origin = os.path.dirname(os.path.realpath(spec.origin)) if spec and spec.origin else ""
        if os.path.dirname(origin) != _ROOT:
            _say(f"zero-code mode off: the module named 'probe' in this job is {origin or 'missing'}, not perfmon's")
            return
        from probe import auto
        auto.install()
    except Exception as exc:
        _say(f"zero-code mode off: {exc!r}")


class _TorchImportWatcher:
    """Meta-path finder that lets torch load normally and calls ``_install_auto`` after it."""

    def __init__(self):
        self.busy = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch" or self.busy:
            return None
        self.busy = True
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            loader = getattr(spec, "loader", None)
            if loader is None or not hasattr(loader, "exec_module"):
                return None
            real_exec = loader.exec_module

            def exec_module(module):
                if module.__name__ != "torch":      # a loader shared with other modules (a zip importer)
                    return real_exec(module)
                try:
                    real_exec(module)
                finally:
                    try:
                        del loader.exec_module      # back to the loader's own method
                    except AttributeError:
                        pass
                _install_auto()

            loader.exec_module = exec_module
        except Exception:
            return None
        finally:
            self.busy = False
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        return spec


_chain_shadowed()
if os.environ.get("PERFMON_AUTO") == "1" and os.environ.get("PERFMON_DISABLE") != "1":
    sys.meta_path.insert(0, _TorchImportWatcher())
