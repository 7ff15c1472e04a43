"""``--k8s SELECTOR [--namespace N]``: the options' rules and the kubectl transport, without
running kubectl (its stand-in runs in tests/integration/test_k8s.py)."""

from __future__ import annotations

import pytest

from tui.errors import UserError
from tui.stream import hosts


def test_the_default_transport_into_a_pod_is_kubectl_exec_with_its_namespace():
    assert hosts.via_argv(hosts.k8s_via("ml team"), "trainer-0", "job") == [
        "kubectl", "exec", "-i", "trainer-0", "--namespace", "ml team", "--", "perfmon", "relay", "--stdio", "job"]
    assert hosts.via_argv(hosts.k8s_via(None), "trainer-0", "job")[:5] == ["kubectl", "exec", "-i", "trainer-0", "--"]


def test_k8s_goes_alone_and_namespace_only_with_it():
    with pytest.raises(UserError, match="only one of --hosts, --hostfile, --slurm, --k8s"):
        hosts.choose_hosts("n01", None, None, "app=x")
    with pytest.raises(UserError, match="--namespace goes with --k8s"):
        hosts.choose_hosts("n01", None, None, None, "ml")


def test_without_kubectl_on_the_path_it_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(UserError, match="^--k8s: kubectl not found on this machine$"):
        hosts.choose_hosts(None, None, None, "app=x")
