"""The accelerate config a run launches with: the bundled ZeRO-3 file (or the user's), with flags applied.

Pure: takes the choices, returns a new config dict and notes; reading files is the only I/O. A user's file is
checked key by key first (a number that is text, a section that is a list), so that what follows can trust it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlhf_cli.config.bundled import bundled_dir
from rlhf_cli.config.draft import suggest
from rlhf_cli.config.fields import OFFLOAD_DEVICES, OWN_FIELDS, FieldTypeError, accelerate_keys, coerce, own_field
from rlhf_cli.config.yaml_file import read_yaml
from rlhf_cli.errors import ConfigError

BUNDLED_CONFIG = "deepspeed_zero3.yaml"
LAYOUT_KEYS = ("num_processes", "num_machines", "machine_rank", "main_process_port")
MIXED_PRECISION = ("no", "fp16", "bf16", "fp8")
ZERO_STAGES = (0, 1, 2, 3)
# DeepSpeed's own JSON keys, which accelerate's `deepspeed_config` ignores (TRL runs such a file): a warning, with
# the accelerate key that does the same where there is one; any other unknown key there is a typo, refused
DEEPSPEED_JSON_KEYS = {"stage3_gather_16bit_weights_on_model_save": "zero3_save_16bit_model",
                       "overlap_comm": None, "contiguous_gradients": None, "reduce_bucket_size": None,
                       "allgather_bucket_size": None, "sub_group_size": None, "round_robin_gradients": None,
                       "allgather_partitions": None, "reduce_scatter": None, "stage3_prefetch_bucket_size": None,
                       "stage3_param_persistence_threshold": None, "stage3_max_live_parameters": None,
                       "stage3_max_reuse_distance": None}


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
    # key -> how a problem names its value and where it came from: `--machine-rank {value}`, `SLURM_NODEID={value}`
    sources: Mapping[str, str] = field(default_factory=dict)
    refused: frozenset[str] = frozenset()  # keys whose given value was refused already: not judged again
    launching: bool = True  # False for `rlhf plan`: it starts nothing, so machine rank 0 needs no address


def _checked(config: dict[str, Any], source: Path, lines: Mapping[str, int], problems: list[str],
             notes: list[str]) -> dict[str, Any]:
    """The config with every value of a wrong type or range dropped and reported (`warning`: noted, not refused)."""
    def bad(key: str, message: str, section: str | None = None, warning: bool = False) -> None:
        line = lines.get(section or key)
        said = f"{source}{f':{line}' if line else ''}: `{key}`: {message}"
        (notes.append(f"warning: {said}") if warning else problems.append(said))

    _drop_unknown_keys(config, bad)
    for key in LAYOUT_KEYS:
        if config.get(key) is not None:
            try:
                config[key] = coerce(own_field(key), config[key])
            except FieldTypeError as error:
                bad(key, str(error))
                del config[key]
    if config.get("mixed_precision") not in (None, *MIXED_PRECISION):
        bad("mixed_precision", f"expected one of {', '.join(MIXED_PRECISION)}, got {config['mixed_precision']!r}")
        del config["mixed_precision"]
    if not isinstance(config.get("distributed_type", ""), str):
        bad("distributed_type", f"expected a name like DEEPSPEED or MULTI_GPU, got {config['distributed_type']!r}")
        del config["distributed_type"]
    deepspeed = config.get("deepspeed_config")
    if deepspeed is not None and not isinstance(deepspeed, dict):
        bad("deepspeed_config", f"expected a mapping of DeepSpeed settings, got {deepspeed!r}")
        del config["deepspeed_config"]
    elif isinstance(deepspeed, dict):
        if deepspeed.get("zero_stage") is not None and deepspeed["zero_stage"] not in ZERO_STAGES:
            bad("deepspeed_config.zero_stage", f"expected 0, 1, 2 or 3, got {deepspeed['zero_stage']!r}",
                "deepspeed_config")
            del deepspeed["zero_stage"]
        for key in ("offload_optimizer_device", "offload_param_device"):
            if deepspeed.get(key) not in (None, *OFFLOAD_DEVICES):
                bad(f"deepspeed_config.{key}", f"expected one of {', '.join(OFFLOAD_DEVICES)}, got "
                    f"{deepspeed[key]!r}", "deepspeed_config")
                del deepspeed[key]
    return config


def _drop_unknown_keys(config: dict[str, Any], bad: Callable[..., None]) -> None:
    """Keys accelerate does not know: a typo at the top makes `accelerate launch` refuse the file once every rank's
    machine is up; one in `deepspeed_config` it ignores without a word (`zero3_init_flg`)."""
    top, deepspeed = accelerate_keys()
    for key in [key for key in config if key not in top]:
        bad(str(key), "not a key of an accelerate config, so `accelerate launch` would refuse the file"
            f"{suggest(str(key), list(top)) or '; remove it'}")
        del config[key]
    section = config.get("deepspeed_config")
    for key in [key for key in section if key not in deepspeed] if isinstance(section, dict) else []:
        if key in DEEPSPEED_JSON_KEYS:
            bad(f"deepspeed_config.{key}", f"DeepSpeed's JSON key, which accelerate ignores here; {_instead(key)}",
                "deepspeed_config", warning=True)
        else:
            bad(f"deepspeed_config.{key}", "not a DeepSpeed setting accelerate knows, so it would be ignored"
                f"{suggest(str(key), list(deepspeed)) or '; remove it'}", "deepspeed_config")
        del section[key]


def _instead(key: str) -> str:
    """Where a DeepSpeed JSON key given in accelerate's `deepspeed_config` takes effect."""
    if DEEPSPEED_JSON_KEYS[key]:
        return f"its accelerate key is `{DEEPSPEED_JSON_KEYS[key]}`"
    if any(field.name == key and field.group == "zero3" for field in OWN_FIELDS):
        return f"set it in the recipe (`{key}:`, or --set {key}=...), which the plan reads too"
    return "put it in a deepspeed_config_file"


def _load(path: Path, problems: list[str], notes: list[str]) -> dict[str, Any]:
    try:
        loaded = read_yaml(path, "accelerate config")
    except ConfigError as error:
        problems.extend(error.problems)
        return {}
    if not isinstance(loaded.values, dict):
        problems.append(f"{path}: an accelerate config is a mapping, got {type(loaded.values).__name__}")
        return {}
    problems.extend(loaded.problems)
    notes.extend(loaded.notes)
    return _checked(loaded.values, path, loaded.lines, problems, notes)


def zero_stage(config: dict[str, Any]) -> int | None:
    """The ZeRO stage of a DeepSpeed config, or None when the config is not DeepSpeed's."""
    if config.get("distributed_type") != "DEEPSPEED":
        return None
    return int((config.get("deepspeed_config") or {}).get("zero_stage", 0))


def is_zero3(config: dict[str, Any]) -> bool:
    return zero_stage(config) == 3


def _check_machines(config: dict[str, Any], said: Mapping[str, str], problems: list[str], missing_ip: bool) -> None:
    """A layout accelerate can start: whole processes per machine, a valid rank, a reachable rank 0 (`missing_ip`:
    say that none is given, unless the one given was refused)."""
    machines = int(config.get("num_machines") or 1)
    processes = int(config.get("num_processes") or 1)
    rank = int(config.get("machine_rank") or 0)
    if processes % machines:
        problems.append(f"{said['num_processes'].format(value=processes)} is not a multiple of "
                        f"{said['num_machines'].format(value=machines)}; num_processes counts processes on all "
                        "machines together")
    if not 0 <= rank < machines:
        problems.append(f"{said['machine_rank'].format(value=rank)} is outside 0..{machines - 1}: "
                        f"{said['num_machines'].format(value=machines)}")
    if machines > 1 and not config.get("main_process_ip") and missing_ip:
        problems.append(f"{machines} machines need --main-process-ip: the address of machine rank 0")


def _apply_num_gpus(config: dict[str, Any], num_gpus: int, num_processes: int | None, problems: list[str]) -> None:
    """GPUs per machine give the total of processes, unless num_processes says otherwise."""
    machines = int(config.get("num_machines") or 1)
    total = num_gpus * machines
    if num_processes is not None and num_processes != total:
        problems.append(f"--num-processes {num_processes} disagrees with --num-gpus {num_gpus} x {machines} "
                        f"machine(s) = {total}; num_processes counts the processes of all machines: drop one")
    config["num_processes"] = total


def build_accelerate_config(choices: AccelerateChoices, problems: list[str]) -> tuple[dict[str, Any], list[str]]:
    """Return the accelerate config to write, and notes for the user; append problems."""
    notes: list[str] = []
    source = Path(choices.user_config) if choices.user_config else bundled_dir("accelerate_configs") / BUNDLED_CONFIG
    config = copy.deepcopy(_load(source, problems, notes))
    deepspeed = config.setdefault("deepspeed_config", {}) if config.get("distributed_type") == "DEEPSPEED" else None
    said = {key: choices.sources.get(key) or f"`{key}: {{value}}` ({source})" for key in LAYOUT_KEYS}

    if choices.num_processes is not None:
        config["num_processes"] = choices.num_processes
    config.update(choices.machines)
    if choices.num_gpus is not None:
        _apply_num_gpus(config, choices.num_gpus, choices.num_processes, problems)
    _check_machines(config, said, problems,
                    missing_ip=choices.launching and "main_process_ip" not in choices.refused)

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
