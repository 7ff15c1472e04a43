"""Which nodes, and how to reach them: SLURM host lists, hostfiles, scontrol, the transport template."""

from __future__ import annotations

import os
import stat

import pytest

from tui.errors import UserError
from tui.stream import hosts as H


@pytest.mark.parametrize("spec, expected", [
    ("n01", ["n01"]),
    ("n[01-03,07],gpu-a", ["n01", "n02", "n03", "n07", "gpu-a"]),
    ("x[1-2]y[8-9]", ["x1y8", "x1y9", "x2y8", "x2y9"]),
    ("n[098-101]", ["n098", "n099", "n100", "n101"]),        # padding from the range's first number
    ("a, b ,a", ["a", "b"]),                                 # duplicates once, spaces ignored
])
def test_slurm_host_lists_expand_as_slurm_does(spec, expected):
    assert H.expand_hostlist(spec) == expected


@pytest.mark.parametrize("spec, message", [
    ("n[1-", "unbalanced '\\['"),
    ("n1]", "unbalanced '\\]'"),
    ("n[a-b]", "cannot read range 'a-b'"),
    ("n[5-2]", "range '5-2' runs backwards"),
    ("n[0-99999]", "over 4096 hosts"),
])
def test_malformed_host_lists_are_one_line_errors(spec, message):
    with pytest.raises(UserError, match=message):
        H.expand_hostlist(spec)


def test_hostfile_takes_the_first_word_of_each_line_and_skips_comments(tmp_path):
    f = tmp_path / "hostfile"
    f.write_text("# nodes\nworker-1 slots=8\n\nworker-[2-3] slots=8  # rack b\n")
    assert H.read_hostfile(f) == ["worker-1", "worker-2", "worker-3"]
    (tmp_path / "empty").write_text("# nothing\n")
    with pytest.raises(UserError, match="no hosts in the hostfile"):
        H.read_hostfile(tmp_path / "empty")
    with pytest.raises(UserError, match="cannot read the hostfile"):
        H.read_hostfile(tmp_path / "missing")


def fake_scontrol(directory, script: str) -> None:
    exe = directory / "scontrol"
    exe.write_text("#!/bin/sh\n" + script)
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)


@pytest.mark.slow
def test_slurm_inside_the_allocation_reads_the_nodelist_with_or_without_scontrol(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu[3-4]")
    assert H.slurm_hosts() == ["gpu3", "gpu4"]              # no scontrol: expanded here
    fake_scontrol(tmp_path, 'test "$1 $2" = "show hostnames" && printf "%s\\n" "g-$3-a" "g-$3-b"\n')
    assert H.slurm_hosts() == ["g-gpu[3-4]-a", "g-gpu[3-4]-b"]   # scontrol's answer is taken as is
    monkeypatch.delenv("SLURM_JOB_NODELIST")
    with pytest.raises(UserError, match="needs SLURM_JOB_NODELIST"):
        H.slurm_hosts()


@pytest.mark.slow
def test_slurm_job_id_asks_scontrol_for_the_jobs_nodes(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    fake_scontrol(tmp_path, 'case "$1 $2" in\n'
                            '"show job") echo "JobId=$3 JobName=train"; echo "   NodeList=n[1-2] BatchHost=n1";;\n'
                            '"show hostnames") echo n1; echo n2;;\nesac\n')
    assert H.slurm_hosts("42") == ["n1", "n2"]
    fake_scontrol(tmp_path, 'echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1\n')
    with pytest.raises(UserError, match="Invalid job id specified$"):
        H.slurm_hosts("43")
    os.unlink(tmp_path / "scontrol")
    with pytest.raises(UserError, match="scontrol not found"):
        H.slurm_hosts("44")


def test_the_transport_template_replaces_host_and_appends_the_relay():
    assert H.via_argv(H.DEFAULT_VIA, "n01", "gpt") == ["ssh", "-T", "-o", "BatchMode=yes", "n01", "perfmon", "relay",
                                                      "--stdio", "gpt"]
    assert H.via_argv("srun --overlap -w {host}", "n7", "j")[:4] == ["srun", "--overlap", "-w", "n7"]
    assert H.via_argv("ssh -J 'jump host' {host}", "n1", "j")[:4] == ["ssh", "-J", "jump host", "n1"]
    for bad, message in (("", "empty transport template"), ("ssh 'open", "No closing quotation")):
        with pytest.raises(UserError, match=message):
            H.via_argv(bad, "n1", "j")


def test_exactly_one_source_of_hosts():
    assert H.choose_hosts(None, None, None) is None
    assert H.choose_hosts("a,b", None, None) == ["a", "b"]
    with pytest.raises(UserError, match="only one of --hosts, --hostfile, --slurm"):
        H.choose_hosts("a", "f", None)
