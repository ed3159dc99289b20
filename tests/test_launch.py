"""The launch command is built without launching; the runner writes the run record and passes signals on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from helpers import RECIPES
from rlhf_cli.config.resolve import RunRequest, resolve
from rlhf_cli.launch import runner
from rlhf_cli.launch.command import Launch, launch_command
from rlhf_cli.launch.module_start import START_SCRIPT, module_argv


def smoke_run(tmp_path: Path, **flags):
    return resolve(RunRequest("rloo", str(RECIPES / "rloo" / "smoke.yaml"),
                              flags={"output_dir": ("--output-dir", str(tmp_path / "out")), **flags}),
                   cwd=tmp_path, cuda=False)


def test_launch_command_is_accelerate_starting_the_rank_module(tmp_path: Path) -> None:
    launch = launch_command(smoke_run(tmp_path), python="/usr/bin/python3")
    out = tmp_path / "out"
    assert launch.argv == ["/usr/bin/python3", str(START_SCRIPT), "rlhf_cli.launch.supervisor",
                           "--config_file", f"{out}/accelerate_config.yaml", "--machine_rank", "0",
                           str(START_SCRIPT), "rlhf_cli.rank", "rloo", f"{out}/recipe.yaml"]
    assert launch.env["DS_ACCELERATOR"] == "cpu"


def test_a_started_module_sees_the_standard_library_not_the_working_directorys(tmp_path: Path) -> None:
    """A `logging.py` or `random.py` beside the user's run replaces nothing in rlhf's processes, while a module of
    theirs there (a reward module) and one on PYTHONPATH are still imported."""
    import subprocess
    import sys

    work, extra = tmp_path / "work", tmp_path / "extra"
    work.mkdir(), extra.mkdir()
    for shadow in ("logging", "random", "runpy", "json"):
        (work / f"{shadow}.py").write_text("raise SystemExit('the working directory shadowed the standard library')")
    (work / "my_rewards.py").write_text("import json, logging, random\nimport on_pythonpath\n"
                                        "print('user module', logging.__file__ != __file__, on_pythonpath.VALUE)\n")
    (extra / "on_pythonpath.py").write_text("VALUE = 7\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(extra), os.environ.get("PYTHONPATH")]))}
    for module, said in (("my_rewards", "user module True 7"), ("rlhf_cli.launch.supervisor", "usage:")):
        done = subprocess.run([*module_argv(sys.executable, module), "--help"], cwd=work, env=env,
                              capture_output=True, text=True, timeout=120)
        assert said in done.stdout, done.stdout + done.stderr


def test_gpu_machines_keep_deepspeeds_accelerator_choice(tmp_path: Path) -> None:
    run = resolve(RunRequest("rloo", str(RECIPES / "rloo" / "smoke.yaml")), cwd=tmp_path, cuda=True)
    assert "DS_ACCELERATOR" not in launch_command(run).env


def test_run_files_are_written_and_launch_sh_reruns_the_same_argv(tmp_path: Path) -> None:
    run = smoke_run(tmp_path, offload_optimizer=("--offload-optimizer", "cpu"))
    runner.write_run_files(run, run.accelerate)
    out = tmp_path / "out"
    recipe = yaml.safe_load((out / "recipe.yaml").read_text())
    assert recipe["offload_optimizer"] == "cpu" and recipe["model_name_or_path"] == str(RECIPES / "smoke" / "policy")
    accelerate = yaml.safe_load((out / "accelerate_config.yaml").read_text())
    assert accelerate["deepspeed_config"]["offload_optimizer_device"] == "cpu"
    script = (out / "launch.sh").read_text()
    assert os.access(out / "launch.sh", os.X_OK)
    assert "export DS_ACCELERATOR=cpu" in script
    assert script.rstrip().endswith(launch_command(run).shell().split("TRL_EXPERIMENTAL_SILENCE=1 ")[1])
    # The resolved recipe is itself a recipe that resolves to the same run.
    again = resolve(RunRequest("rloo", str(out / "recipe.yaml"), overwrite=True), cwd=tmp_path, cuda=False)
    assert again.recipe_values() == run.recipe_values()


def test_sigterm_reaches_the_ranks_and_their_status_is_returned(tmp_path: Path, monkeypatch, check_passes) -> None:
    marker = tmp_path / "got-term"
    rank = f"""
import signal, sys, time
def stop(*_):
    open({str(marker)!r}, "w").write("term")
    sys.exit(7)
signal.signal(signal.SIGTERM, stop)
time.sleep(60)
"""
    monkeypatch.setattr(runner, "launch_command", lambda run, verbosity: Launch([sys.executable, "-c", rank], {}))
    run = smoke_run(tmp_path)
    threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
    started = time.monotonic()
    outcome = runner.launch(run)
    assert outcome.exit_code == 7 and outcome.status == "interrupted" and marker.read_text() == "term"
    assert time.monotonic() - started < 30
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # our handler is gone again


@pytest.mark.parametrize("signum", [signal.SIGKILL])
def test_a_launch_supervisor_killed_by_a_signal_gives_128_plus_signal(tmp_path: Path, monkeypatch, signum: int,
                                                                 check_passes) -> None:
    supervisor = f"import os; os.kill(os.getpid(), {int(signum)})"
    monkeypatch.setattr(runner, "launch_command", lambda run, verbosity: Launch([sys.executable, "-c", supervisor], {}))
    outcome = runner.launch(smoke_run(tmp_path))
    assert outcome.exit_code == 128 + signum and outcome.status == "failed"
    assert outcome.failure.line == f"the ranks exited with code {128 + signum} without recording an error; see the " \
                                   f"output above and the ranks' logs ({tmp_path / 'out' / 'ranks'}/rank-N.log)"


def test_sigterm_during_the_pre_launch_check_stops_the_waiting_supervisor_with_nothing_written(
        tmp_path: Path, monkeypatch, check_passes) -> None:
    started = tmp_path / "supervisor-started"
    supervisor = f"import time; open({str(started)!r}, 'w').close(); time.sleep(60)"
    monkeypatch.setattr(runner, "launch_command", lambda run, verbosity: Launch([sys.executable, "-c", supervisor], {}))
    check_passes.delay = 3.0
    threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
    begun = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        runner.launch(smoke_run(tmp_path))
    assert time.monotonic() - begun < 10 and started.exists()  # the supervisor had started, and was stopped
    assert not (tmp_path / "out").exists()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_supervisor_that_ends_before_the_gate_opens_is_a_failed_run_not_a_traceback(
        tmp_path: Path, monkeypatch, check_passes) -> None:
    monkeypatch.setattr(runner, "launch_command", lambda run, verbosity: Launch([sys.executable, "-c",
                                                                                  "raise SystemExit(3)"], {}))
    check_passes.delay = 1.0  # the supervisor is gone before the check ends
    outcome = runner.launch(smoke_run(tmp_path))
    assert outcome.exit_code == 3 and outcome.status == "failed"


def test_launch_sh_is_runnable_bash(tmp_path: Path) -> None:
    run = smoke_run(tmp_path)
    runner.write_run_files(run, run.accelerate)
    assert subprocess.run(["bash", "-n", str(tmp_path / "out" / "launch.sh")]).returncode == 0
