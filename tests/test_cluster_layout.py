"""Multi-node layout: flags, SLURM's and torchrun's variables, and what `--dry-run` shows of them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import RECIPES
from rlhf_cli.config.cluster import first_host
from rlhf_cli.config.fields import is_host
from rlhf_cli.config.resolve import RunRequest, resolve
from rlhf_cli.errors import ConfigError
from rlhf_cli.launch.command import launch_command

SMOKE = str(RECIPES / "rloo" / "smoke.yaml")
SLURM = {"SLURM_JOB_ID": "4242", "SLURM_NNODES": "2", "SLURM_NODEID": "1", "SLURM_STEP_ID": "0",
         "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_GPUS_ON_NODE": "8", "MASTER_PORT": "29555"}
TORCHRUN = {"MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29400", "NODE_RANK": "2", "NNODES": "4"}


def run_in(environ: dict[str, str], tmp_path: Path, **flags):
    request = RunRequest("rloo", SMOKE, flags={"output_dir": ("-o", str(tmp_path / "out")), **flags})
    return resolve(request, cwd=tmp_path, cuda=True, environ=environ)


@pytest.mark.parametrize(("nodelist", "host"), [("gpu[07-08]", "gpu07"), ("node[3,5-9],login1", "node3"),
                                                ("a100-01,a100-02", "a100-01"), ("single", "single"),
                                                ("rack[2-3]-gpu[05,07-09]", "rack2-gpu05"),
                                                ("login1,gpu[1-2]", "login1")])
def test_first_host_of_a_slurm_node_list(nodelist: str, host: str) -> None:
    assert first_host(nodelist) == host


@pytest.mark.parametrize("nodelist", ["gpu[01-", "gpu01-]", "gpu[]", "gpu[a-b]", "gpu[3-1]", "gpu[1-2", ",gpu1",
                                      "gpu1,,gpu2", "gpu 1", "[1-2", ""])
def test_a_malformed_node_list_has_no_first_host(nodelist: str) -> None:
    assert first_host(nodelist) is None


def test_a_flag_beats_a_malformed_variable(tmp_path: Path) -> None:
    """The errors say "fix the job's variables or pass --FLAG": passing the flag is enough."""
    broken = {**SLURM, "SLURM_JOB_NODELIST": "gpu[07-", "SLURM_GPUS_ON_NODE": "eight", "SLURM_NNODES": "zero"}
    run = run_in(broken, tmp_path, main_process_ip=("--main-process-ip", "10.0.0.1"),
                 num_processes=("--num-processes", 4), num_machines=("--num-machines", 2))
    assert (run.accelerate["main_process_ip"], run.accelerate["num_processes"], run.accelerate["num_machines"]) == \
        ("10.0.0.1", 4, 2)


def test_slurm_allocation_fills_the_layout_and_says_where_from(tmp_path: Path) -> None:
    run = run_in(SLURM, tmp_path)
    assert {key: run.accelerate[key] for key in ("num_machines", "num_processes", "main_process_ip",
                                                  "main_process_port", "machine_rank")} == \
        {"num_machines": 2, "num_processes": 16, "main_process_ip": "gpu07", "main_process_port": 29555,
         "machine_rank": 1}
    assert run.settings["num_machines"].source == "env SLURM_NNODES"
    assert run.settings["num_processes"].source == "env SLURM_GPUS_ON_NODE x SLURM_NNODES"
    argv = launch_command(run).argv
    assert argv[argv.index("--machine_rank") + 1] == "1"
    # Machine 1 keeps its launch files apart from machine 0's, in the shared output dir.
    assert argv[-1] == str(tmp_path / "out" / "machines" / "machine-1" / "recipe.yaml")


def test_torchrun_variables_fill_the_layout(tmp_path: Path) -> None:
    run = run_in(TORCHRUN, tmp_path, num_processes=("--num-processes", 32))
    assert (run.accelerate["num_machines"], run.accelerate["machine_rank"], run.accelerate["main_process_ip"],
            run.accelerate["main_process_port"], run.accelerate["num_processes"]) == (4, 2, "10.0.0.5", 29400, 32)
    assert run.settings["machine_rank"].source == "env NODE_RANK"


def test_flags_beat_the_environment_which_beats_the_recipe(tmp_path: Path) -> None:
    run = run_in(SLURM, tmp_path, machine_rank=("--machine-rank", 0), num_processes=("--num-processes", 4))
    assert run.accelerate["machine_rank"] == 0 and run.settings["machine_rank"].source == "flag --machine-rank"
    assert run.accelerate["num_processes"] == 4  # the smoke recipe's 2 lost to SLURM's 16, which lost to the flag


def test_a_multi_node_slurm_job_outside_srun_is_warned_about(tmp_path: Path) -> None:
    environ = {key: value for key, value in SLURM.items() if key != "SLURM_STEP_ID"}
    notes = run_in(environ, tmp_path).notes
    assert any("srun --ntasks-per-node=1" in note and note.startswith("warning:") for note in notes)


@pytest.mark.parametrize(("flags", "problem"), [
    ({"num_machines": ("--num-machines", 2), "num_processes": ("--num-processes", 3),
      "main_process_ip": ("--main-process-ip", "h")}, "--num-processes 3 is not a multiple of --num-machines 2"),
    ({"num_machines": ("--num-machines", 2), "machine_rank": ("--machine-rank", 2),
      "main_process_ip": ("--main-process-ip", "h")}, "--machine-rank 2 is outside 0..1"),
    ({"num_machines": ("--num-machines", 2)}, "2 machines need --main-process-ip"),
])
def test_impossible_layouts_are_refused_before_launch(tmp_path: Path, flags: dict, problem: str) -> None:
    with pytest.raises(ConfigError) as raised:
        run_in({}, tmp_path, **flags)
    assert any(problem in line for line in raised.value.problems), raised.value.problems


def test_dry_run_json_shows_the_slurm_layout(cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for key, value in SLURM.items():
        monkeypatch.setenv(key, value)
    result = cli("rloo", "-r", "rloo/smoke", "-o", tmp_path / "out", "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert shown["accelerate"]["num_machines"] == 2 and shown["accelerate"]["main_process_ip"] == "gpu07"
    assert shown["sources"]["machine_rank"] == "env SLURM_NODEID"
    assert shown["launch"]["argv"][shown["launch"]["argv"].index("--machine_rank") + 1] == "1"


@pytest.mark.parametrize(("text", "valid"), [("10.0.0.1", True), ("fe80::1", True), ("gpu01", True),
                                             ("gpu-01.cluster.local", True), ("node_7", True), ("gpu01.", True),
                                             ("not an ip!!", False), ("-gpu01", False), ("gpu01-", False),
                                             ("a..b", False), ("", False), ("x" * 64, False),
                                             ("10.0.0.1:29500", False)])
def test_a_host_is_an_ip_address_or_a_host_name(text: str, valid: bool) -> None:
    assert is_host(text) is valid
