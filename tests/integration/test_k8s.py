"""Jobs in Kubernetes pods: ``--k8s SELECTOR [--namespace N]`` finds the pods through ``kubectl get
pods`` and reaches each through ``kubectl exec -i POD --``, both tested with a stand-in kubectl
(tests/integration/scripts/kubectl_standin.py) whose "pods" are socket directories on this machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import perfmon
from tests.integration.streamutil import JOBS

SCRIPTS = Path(__file__).parent / "scripts"
BIN = str(Path(sys.executable).parent)          # `perfmon` as the pod's shell would find it


@pytest.fixture
def pods(tmp_path_factory):
    """Two "pods", each running rank r of job k8sjob in a socket directory of its own."""
    tmp_path = tmp_path_factory.mktemp("pods")       # short: the pods' sockets are under it
    standin = tmp_path / "bin"
    standin.mkdir()
    kubectl = standin / "kubectl"
    kubectl.write_text(f"#!/bin/sh\nexec {sys.executable} {SCRIPTS / 'kubectl_standin.py'} \"$@\"\n")
    kubectl.chmod(0o755)
    jobs = []
    for rank, pod in enumerate(("trainer-0", "trainer-1")):
        (tmp_path / pod).mkdir(mode=0o700)
        env = {**os.environ, "PERFMON_DIR": str(tmp_path / pod), "RANK": str(rank), "WORLD_SIZE": "2"}
        proc = subprocess.Popen([sys.executable, str(JOBS / "api_job.py"), "k8sjob", "100000", "1", "2", "2"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        assert proc.stdout.readline().strip().endswith(".sock")
        jobs.append(proc)
    env = {**os.environ, "PATH": f"{standin}{os.pathsep}{BIN}{os.pathsep}{os.environ['PATH']}",
           "KUBECTL_LOG": str(tmp_path / "kubectl.log"), "KUBECTL_BASE": str(tmp_path),
           "KUBECTL_PODS": "trainer-0 trainer-1"}
    env.pop("PERFMON_DIR", None)
    env.pop("PERFMON_VIA", None)
    yield env
    for proc in jobs:
        proc.kill()
        proc.wait()


def _calls(env: dict) -> list[list[str]]:
    return [json.loads(line) for line in Path(env["KUBECTL_LOG"]).read_text().splitlines()]


def test_the_pods_of_a_selector_are_found_and_reached_through_kubectl_exec(pods):
    out = perfmon("report", "k8sjob", "--k8s", "app=trainer", "--namespace", "ml", "--json", "--seconds", "4", env=pods)
    assert out.returncode == 0, out.stderr
    assert sorted(r["rank"] for r in json.loads(out.stdout)["ranks"]) == [0, 1]
    calls = _calls(pods)
    assert calls[0] == ["get", "pods", "-l", "app=trainer", "--field-selector=status.phase=Running",
                        "-o", "jsonpath={.items[*].metadata.name}", "--namespace", "ml"]
    assert sorted(c for c in calls[1:]) == [
        ["exec", "-i", pod, "--namespace", "ml", "--", "perfmon", "relay", "--stdio", "k8sjob"]
        for pod in ("trainer-0", "trainer-1")]


def test_a_via_template_with_kubectl_exec_reaches_the_pods_too(pods):
    out = perfmon("report", "k8sjob", "--k8s", "app=trainer", "--via", "kubectl exec -i {host} --",
                  "--json", "--seconds", "4", env=pods)
    assert out.returncode == 0, out.stderr
    assert len(json.loads(out.stdout)["ranks"]) == 2
    assert ["exec", "-i", "trainer-1", "--", "perfmon", "relay", "--stdio", "k8sjob"] in _calls(pods)


def test_no_running_pod_is_one_line(pods):
    out = perfmon("report", "k8sjob", "--k8s", "app=none", "--namespace", "ml", env={**pods, "KUBECTL_PODS": ""})
    assert out.returncode == 2
    assert out.stderr == "perfmon report: --k8s app=none: no running pod matches in namespace ml\n"
