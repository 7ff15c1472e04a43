"""``perfmon run`` helpers: default job name, the job's environment, exit status mapping."""

from __future__ import annotations

import os

from tui.commands.run import AUTOSTART_DIR, exit_code, job_env, job_name


def test_job_name_is_the_training_script():
    assert job_name(["python", "train.py", "--lr", "3e-4"]) == "train"
    assert job_name(["torchrun", "--nproc-per-node", "8", "/src/gpt/pretrain.py"]) == "pretrain"
    assert job_name(["python", "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "pkg.finetune"]) \
        == "finetune"
    assert job_name(["bash", "scripts/launch.sh"]) == "launch"
    assert job_name(["./my job"]) == "my-job"


def test_job_env_puts_the_autostart_first_and_keeps_the_users_path():
    env = job_env({"PYTHONPATH": "/a" + os.pathsep + "/b", "HOME": "/h"}, job="gpt", record=None, unbuffered=False)
    assert env["PYTHONPATH"].split(os.pathsep) == [str(AUTOSTART_DIR), "/a", "/b"]
    assert env["PERFMON_AUTO"] == "1" and env["PERFMON_JOB"] == "gpt" and "PERFMON_RECORD" not in env
    assert "PYTHONUNBUFFERED" not in env and env["HOME"] == "/h"
    env = job_env({}, job="gpt", record=AUTOSTART_DIR, unbuffered=True)
    assert env["PYTHONPATH"] == str(AUTOSTART_DIR) and env["PERFMON_RECORD"] == str(AUTOSTART_DIR)
    assert env["PYTHONUNBUFFERED"] == "1"
    assert (AUTOSTART_DIR / "sitecustomize.py").is_file()


def test_exit_code_is_what_a_shell_reports():
    assert exit_code(0) == 0 and exit_code(7) == 7
    assert exit_code(-2) == 130 and exit_code(-9) == 137
