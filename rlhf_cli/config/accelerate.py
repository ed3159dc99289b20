"""The accelerate config a run launches with: the bundled ZeRO-3 file (or the user's), with flags applied.

Pure: takes the choices, returns a new config dict and notes; reading files is the only I/O.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rlhf_cli.config.bundled import bundled_dir

BUNDLED_CONFIG = "deepspeed_zero3.yaml"


@dataclass(frozen=True)
class AccelerateChoices:
    user_config: str | None = None
    num_processes: int | None = None
    num_gpus: int | None = None  # per machine: num_processes = num_gpus x num_machines
    machines: dict[str, Any] = field(default_factory=dict)  # num_machines, machine_rank, main_process_ip/port
    offload_optimizer: str | None = None  # None: keep what the config file says
    offload_params: str | None = None
    nvme_path: str | None = None
    gather: bool = True
    zero3: dict[str, int] = field(default_factory=dict)
    cpu_only: bool = False


def _load(path: Path, problems: list[str]) -> dict[str, Any]:
    try:
        config = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        problems.append(f"{path}: cannot read accelerate config ({error.__class__.__name__})")
        return {}
    if not isinstance(config, dict):
        problems.append(f"{path}: an accelerate config is a mapping, got {type(config).__name__}")
        return {}
    return config


def is_zero3(config: dict[str, Any]) -> bool:
    deepspeed = config.get("deepspeed_config") or {}
    return config.get("distributed_type") == "DEEPSPEED" and int(deepspeed.get("zero_stage", 0)) == 3


def _check_machines(config: dict[str, Any], problems: list[str]) -> None:
    """A layout accelerate can start: whole processes per machine, a valid rank, a reachable rank 0."""
    machines = int(config.get("num_machines") or 1)
    processes = int(config.get("num_processes") or 1)
    rank = int(config.get("machine_rank") or 0)
    if machines < 1:
        problems.append(f"--num-machines must be at least 1, got {machines}")
        return
    if processes % machines:
        problems.append(f"--num-processes {processes} is not a multiple of --num-machines {machines}; "
                        "num_processes counts processes on all machines together")
    if not 0 <= rank < machines:
        problems.append(f"--machine-rank {rank} is outside 0..{machines - 1} for {machines} machine(s)")
    if machines > 1 and not config.get("main_process_ip"):
        problems.append(f"{machines} machines need --main-process-ip: the address of machine rank 0")


def _apply_num_gpus(config: dict[str, Any], num_gpus: int, num_processes: int | None, problems: list[str]) -> None:
    """GPUs per machine give the total of processes, unless num_processes says otherwise."""
    machines = int(config.get("num_machines") or 1)
    if num_gpus < 1:
        problems.append(f"--num-gpus must be at least 1, got {num_gpus}")
        return
    total = num_gpus * machines
    if num_processes is not None and num_processes != total:
        problems.append(f"--num-processes {num_processes} disagrees with --num-gpus {num_gpus} x {machines} "
                        f"machine(s) = {total}; num_processes counts the processes of all machines: drop one")
    config["num_processes"] = total


def build_accelerate_config(choices: AccelerateChoices, problems: list[str]) -> tuple[dict[str, Any], list[str]]:
    """Return the accelerate config to write, and notes for the user; append problems."""
    notes: list[str] = []
    source = Path(choices.user_config) if choices.user_config else bundled_dir("accelerate_configs") / BUNDLED_CONFIG
    config = copy.deepcopy(_load(source, problems))
    deepspeed = config.setdefault("deepspeed_config", {}) if config.get("distributed_type") == "DEEPSPEED" else None

    if choices.num_processes is not None:
        if choices.num_processes < 1:
            problems.append(f"--num-processes must be at least 1, got {choices.num_processes}")
        config["num_processes"] = choices.num_processes
    config.update(choices.machines)
    if choices.num_gpus is not None:
        _apply_num_gpus(config, choices.num_gpus, choices.num_processes, problems)
    _check_machines(config, problems)

    if not is_zero3(config):
        what = f"{source} is not a DeepSpeed ZeRO-3 config"
        if choices.gather is False:
            notes.append(f"warning: --no-gather has no effect: {what}")
        if choices.offload_params not in (None, "none"):
            notes.append(f"warning: --offload-params has no effect: {what}")
        if choices.zero3:
            notes.append(f"warning: {', '.join(choices.zero3)} have no effect: {what}")
    if deepspeed is not None:
        if "deepspeed_config_file" in deepspeed and (choices.offload_optimizer or choices.offload_params):
            problems.append(f"{source} points at a deepspeed_config_file; set offload there, not with flags")
        for device, key, nvme_key in (
            (choices.offload_optimizer, "offload_optimizer_device", "offload_optimizer_nvme_path"),
            (choices.offload_params, "offload_param_device", "offload_param_nvme_path"),
        ):
            if device is not None:
                deepspeed[key] = device
            if deepspeed.get(key) == "nvme":
                nvme = choices.nvme_path or deepspeed.get(nvme_key)
                if nvme in (None, "none"):
                    problems.append(f"{key} is nvme but no --nvme-path DIR is given")
                deepspeed[nvme_key] = nvme
    elif choices.offload_optimizer not in (None, "none") or choices.offload_params not in (None, "none"):
        problems.append(f"{source} does not use DeepSpeed; offloading needs a DeepSpeed config")

    if choices.cpu_only:
        # Records the intent; DeepSpeed's launcher path ignores it. What makes the ranks run on the CPU
        # is DS_ACCELERATOR=cpu (launch) and ddp_backend=gloo, bf16=false (resolve).
        config["use_cpu"] = True
        config["mixed_precision"] = "no"
    return config, notes
