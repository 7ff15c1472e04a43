"""The socket directory is refused, with the reason, unless it is private to us."""

from __future__ import annotations

import os
import stat

import pytest

import probe
from probe import paths


def test_created_directory_is_0700_and_socket_is_0600(tmp_path, monkeypatch):
    target = tmp_path / "fresh"
    monkeypatch.setenv("PERFMON_DIR", str(target))
    mon = probe.start(job="perm")
    try:
        assert stat.S_IMODE(os.stat(target).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(mon.socket_path).st_mode) == 0o600
        assert stat.S_ISSOCK(os.stat(mon.socket_path).st_mode)
    finally:
        mon.close()
    assert not mon.socket_path.exists()


@pytest.mark.parametrize("mode", [0o777, 0o750, 0o701])
def test_group_or_other_access_is_refused(tmp_path, mode):
    d = tmp_path / "open"
    d.mkdir()
    os.chmod(d, mode)
    with pytest.raises(paths.UnsafeDirectory, match="lets group/others in"):
        paths.check_dir(d)


def test_symlinked_directory_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(paths.UnsafeDirectory, match="it is a symlink"):
        paths.check_dir(link)


def test_directory_owned_by_someone_else_is_refused(tmp_path, monkeypatch):
    d = tmp_path / "theirs"
    d.mkdir(mode=0o700)
    monkeypatch.setattr(os, "getuid", lambda: os.stat(d).st_uid + 1)
    with pytest.raises(paths.UnsafeDirectory, match="owned by uid"):
        paths.check_dir(d)


def test_probe_with_unsafe_directory_still_runs_and_says_why(tmp_path, monkeypatch, capfd):
    d = tmp_path / "open"
    d.mkdir()
    os.chmod(d, 0o777)
    monkeypatch.setenv("PERFMON_DIR", str(d))
    mon = probe.start(job="unsafe", record=tmp_path / "rec")
    try:
        with mon.step():
            pass
        assert mon.socket_path is None
        assert any("lets group/others in" in p for p in mon.problems)
        assert mon.record_path is not None  # recording still works
    finally:
        mon.close()
    assert "perfmon: live view off: refusing socket directory" in capfd.readouterr().err


def test_names_round_trip_and_carry_job_rank_restart_pid():
    name = paths.base_name("gpt small/v2", 3, 1, 4242)
    assert name == "gpt-small-v2.r3.x1.p4242"
    assert paths.parse_name(name + paths.SOCKET_SUFFIX) == paths.SocketName("gpt-small-v2", 3, 1, 4242)
    assert paths.parse_name("garbage.sock") is None


def test_a_socket_directory_too_long_for_a_unix_socket_says_which_and_what_to_do(tmp_path, monkeypatch):
    from probe.endpoints import SUN_PATH_MAX, listen_unix

    deep = tmp_path / ("d" * (SUN_PATH_MAX - len(str(tmp_path))))
    deep.mkdir(mode=0o700)
    monkeypatch.setenv("PERFMON_DIR", str(deep))
    with pytest.raises(OSError, match=r"bytes, over the 107 a Unix socket takes: set PERFMON_DIR to a shorter"):
        listen_unix("job-r0")
    assert list(deep.iterdir()) == []
