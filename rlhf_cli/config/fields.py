"""Every key a recipe may hold, with its type, range, default and help, read without importing TRL.

TRL's fields come from the JSON snapshots in `rlhf_cli/schema/`, their ranges from `rlhf_cli/schema/ranges.yaml`;
the keys that TRL's recipe format lacks (how to launch, what to offload, ZeRO-3 tuning) are declared here.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import math
import re
from collections.abc import Mapping
from dataclasses import replace
from functools import cache
from importlib import resources
from typing import Any

import yaml

from rlhf_cli import algorithms
from rlhf_cli.config.engines import ENGINE_FIELDS
from rlhf_cli.config.field_types import Field, Limits, choices_text

OFFLOAD_DEVICES = ("none", "cpu", "nvme")
# `auto`: let the memory plan choose (rlhf_cli/plan); resolution turns it into true or false.
GATHER_CHOICES = (True, False, "auto")
# Short names people type, each the field it stands for: `gather` is TRL's ds3_gather_for_generation (true, false,
# or auto), not a field of its own.
ALIASES = {"gather": "ds3_gather_for_generation"}


RESUME_AUTO = "auto"  # `--resume auto`: the newest whole checkpoint in the output dir
# Fields TRL types as one kind but also takes true/false for, and what its __post_init__ or Trainer.train makes of them.
TRL_BOOL_MEANINGS = {
    "scale_rewards": {True: "group", False: "none"},  # GRPOConfig.__post_init__
    "resume_from_checkpoint": {True: RESUME_AUTO, False: None},  # Trainer.train: true = the newest in output_dir
}


INT64 = 2**63  # every integer must fit: torch, NumPy and DeepSpeed store them in 64 bits
# YAML 1.1 reads these words unquoted as true or false.
YAML_BOOL_WORDS = {True: ("yes", "on", "true", "y"), False: ("no", "off", "false", "n")}


# Keys TRL's recipe format lacks. They sit at the top level of a recipe next to TRL's keys.
OWN_FIELDS = (
    Field("gather_budget", "launch", ("float", "str", "null"), None,
          "Under ZeRO-3: the share of the policy's parameters (0.5) or the bytes (2GiB) each rank gathers once per "
          "generation call, as whole layers, embedding and LM head; the rest is fetched per token. gather: true is "
          "1, gather: false is 0."),
    Field("offload_optimizer", "launch", ("str",), "none",
          "Where ZeRO-3 keeps optimizer states.", OFFLOAD_DEVICES),
    Field("offload_params", "launch", ("str",), "none",
          "Where ZeRO-3 keeps parameters between uses.", OFFLOAD_DEVICES),
    Field("nvme_path", "launch", ("str", "null"), None,
          "Directory on a local NVMe disk, needed when anything is offloaded to nvme."),
    Field("num_processes", "launch", ("int", "null"), None,
          "Processes (GPUs) in total; default: the accelerate config's value."),
    Field("num_machines", "launch", ("int", "null"), None,
          "Machines (nodes) in the job; default: the accelerate config's value, or SLURM's/torchrun's."),
    Field("machine_rank", "launch", ("int", "null"), None,
          "This machine's rank, 0 to num_machines-1; default: from SLURM or torchrun variables."),
    Field("main_process_ip", "launch", ("str", "null"), None,
          "Address of machine rank 0, reachable from every machine; default: from SLURM or torchrun."),
    Field("main_process_port", "launch", ("int", "null"), None,
          "Port on machine rank 0 for the rendezvous; default: a free port on one machine, 29500 on several."),
    Field("num_gpus", "launch", ("int", "null"), None,
          "GPUs per machine; sets num_processes to num_gpus x num_machines when that is not given."),
    Field("gpu_memory", "launch", ("str", "int", "null"), None,
          "Memory of each GPU for the memory plan (24GiB, 24GB, 24576MiB or bytes); default: asked of nvidia-smi."),
    Field("gpu", "launch", ("str", "null"), None,
          "The GPU the time plan assumes (a10, l4, l40s, rtx3090, rtx4090, a100-40gb, a100-80gb, h100, h200, b200, "
          "...); default: nvidia-smi's."),
    Field("interconnect", "launch", ("str", "null"), None,
          "How the GPUs of a machine reach each other, for the time plan: nvlink, pcie, or a rate each way per GPU "
          "(50GB); default: the GPU's."),
    Field("network", "launch", ("str", "null"), None,
          "The link between machines for the time plan: a rate each way per GPU (25GB); default: by GPU class."),
    Field("hardware_file", "launch", ("str", "null"), None,
          "A YAML file describing a GPU the table lacks, for the time plan: name, bf16_tflops, "
          "memory_bandwidth_gbs, interconnect, interconnect_gbs, host_gbs."),
    Field("plan_prompt_length", "launch", ("int", "null"), None,
          "Longest prompt in tokens, as the memory plan assumes it; default 512."),
    Field("accelerate_config", "launch", ("str", "null"), None,
          "Your own accelerate config to start from instead of the bundled ZeRO-3 one."),
    Field("merge_adapter", "model", ("bool",), False,
          "With use_peft: also save the policy with its adapter merged in (OUTPUT_DIR/merged), for from_pretrained."),
    Field("stall_timeout", "launch", ("int", "float"), 120,
          "Seconds without progress on any rank (or without a rank's heartbeat) before the job stops and names the "
          "stalled rank; loading and saving do not count. The collective timeout (ddp_timeout) follows it."),
    *ENGINE_FIELDS,
    Field("weight_sync_delta", "launch", ("bool",), True,
          "With a separate generator in bf16/fp16: after the first weight sync send only what changed (a "
          "shard-local delta); false: every sync sends the whole policy (dense, for debugging or comparison)."),
    Field("dataset_prompt_column", "script", ("str",), "prompt",
          "Dataset column holding the prompt (plain text or a list of chat messages)."),
    Field("env", "launch", ("dict",), {},
          "Environment variables set in every rank, on every machine (TRL's `env:` block of a config file)."),
    Field("stage3_prefetch_bucket_size", "zero3", ("int", "null"), None,
          "ZeRO-3: parameter elements fetched ahead of use; default: DeepSpeed's (5e7)."),
    Field("stage3_param_persistence_threshold", "zero3", ("int", "null"), None,
          "ZeRO-3: parameters smaller than this stay whole on every rank; default: DeepSpeed's (1e5)."),
    Field("stage3_max_live_parameters", "zero3", ("int", "null"), None,
          "ZeRO-3: most parameter elements kept gathered at once; default: DeepSpeed's (1e9)."),
    Field("overlap_comm", "zero3", ("bool", "null"), None,
          "ZeRO-3: fetch parameters and reduce gradients on a stream of their own, overlapped with compute; "
          "default: DeepSpeed's (true under ZeRO-3). false runs them on the compute stream, in the plan too."),
)

# Code a recipe names for the trainers that take it (`Algorithm.takes_tools`): constructor arguments, not config
# fields, resolved like `reward_funcs` (rlhf_cli/config/code_refs.py) and imported in the ranks.
AGENT_FIELDS = (
    Field("tools", "script", ("list", "null"), None,
          "Functions the policy may call while it generates (GRPOTrainer's `tools`): file.py:function or "
          "package.module:function, each with type hints and a docstring with an Args: section."),
    Field("environment_factory", "script", ("str", "dict", "null"), None,
          "A class built once per rollout whose public methods are the tools (GRPOTrainer's environment_factory): "
          "file.py:Class, or a mapping of environment names (the dataset's `environment` column) to classes."),
    Field("rollout_func", "script", ("str", "null"), None,
          "Your own generation function in place of the trainer's (GRPOTrainer's rollout_func): file.py:function."),
    Field("tool_timeout", "script", ("int", "float", "null"), None,
          "Seconds one tool call may take (tools and environment methods); a call past it is a failed call, its "
          "error fed back to the policy, and the run goes on. Default: no limit, as TRL."),
)


@cache
def _snapshot(algorithm: str) -> dict[str, Any]:
    return json.loads(resources.files("rlhf_cli.schema").joinpath(f"{algorithm}.json").read_text())


@cache
def ranges() -> dict[str, Any]:
    """rlhf_cli/schema/ranges.yaml: ranges of recipe keys, of generation_kwargs, and rules across keys."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(resources.files("rlhf_cli.schema").joinpath("ranges.yaml").read_text(), Loader=loader)


def _limits(spec: Mapping[str, Any] | None) -> Limits | None:
    if spec is None:
        return None
    bounds = {key: spec.get(key) for key in ("min", "max", "above", "below")}
    return Limits(**bounds, also=tuple(spec.get("also", ())), why=spec.get("why", ""))


def trl_reward_functions(algorithm: str) -> tuple[str, ...]:
    """The names TRL's scripts take in `reward_funcs` (their `reward_funcs_registry`)."""
    return tuple(_snapshot(algorithm)["reward_functions"])


def trl_reward_factory_arguments(algorithm: str, name: str) -> dict[str, Any] | None:
    """What TRL's scripts call the factory `name` with (`get_soft_overlong_punishment`), or None for a function."""
    return _snapshot(algorithm)["reward_functions"][name]


def snapshot_list(algorithm: str, name: str) -> tuple[str, ...]:
    """A list the snapshot keeps beside the fields: `generation_keys`, `accelerate_launch_options`,
    `dataset_entry_keys`."""
    return tuple(_snapshot(algorithm)[name])


def accelerate_keys() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the keys of an accelerate config file, the options of `accelerate launch`, which its `deepspeed_config`
    section sets): the same in every algorithm's snapshot."""
    any_algorithm = next(iter(algorithms.ALGORITHMS))
    return snapshot_list(any_algorithm, "accelerate_config_keys"), snapshot_list(any_algorithm,
                                                                                 "accelerate_launch_options")


@cache
def catalogue(algorithm: str) -> dict[str, Field]:
    """All recipe keys for one algorithm, TRL's and ours, each with its range."""
    snapshot = _snapshot(algorithm)
    fields = {
        name: Field(name, spec["group"], tuple(spec["kinds"]), spec["default"], spec["help"],
                    tuple(spec["choices"]) if "choices" in spec else None)
        for name, spec in snapshot["fields"].items()
    }
    fields.update({field.name: field for field in OWN_FIELDS})
    if algorithms.algorithm(algorithm).takes_tools:
        fields.update({field.name: field for field in AGENT_FIELDS})
    for name in TRL_BOOL_MEANINGS.keys() & fields.keys():
        fields[name] = replace(fields[name], kinds=(*fields[name].kinds, "bool"))
    gather = fields["ds3_gather_for_generation"]
    fields[gather.name] = replace(gather, kinds=(*gather.kinds, "str"), choices=GATHER_CHOICES)
    for name, spec in ranges()["fields"].items():
        if name in fields:
            fields[name] = replace(fields[name], limits=_limits(spec))
    for name, values in fixed_choices().items():
        if name in fields and fields[name].choices is None:
            fields[name] = replace(fields[name], choices=tuple(values))
    return fields


@cache
def fixed_choices() -> dict[str, list[str]]:
    """rlhf_cli/schema/choices.yaml: the values of TRL's `str` fields that only its trainers check."""
    return yaml.safe_load(resources.files("rlhf_cli.schema").joinpath("choices.yaml").read_text())


@cache
def own_field(name: str) -> Field:
    """One of rlhf's own keys with its range, for values that come from elsewhere (an accelerate config)."""
    field = next(field for field in OWN_FIELDS if field.name == name)
    return replace(field, limits=_limits(ranges()["fields"].get(name)))


@cache
def generation_fields() -> dict[str, Field]:
    """What each key of `generation_kwargs` takes, as fields (rlhf_cli/schema/ranges.yaml)."""
    return {name: Field(name, "generation", tuple(spec["kinds"]), None, "", limits=_limits(spec))
            for name, spec in ranges()["generation_kwargs"].items()}


class FieldTypeError(ValueError):
    """A value that does not fit its field; the message says what was expected."""


def _quote_hint(field: Field, value: bool) -> str:
    """`save_strategy: no` reaches us as false: say to quote the word."""
    words = [word for word in YAML_BOOL_WORDS[value] if field.choices and word in field.choices]
    return f"; YAML reads an unquoted {words[0]} as {str(value).lower()}: write '{words[0]}'" if words else ""


def _checked_number(field: Field, value: int | float) -> int | float:
    if isinstance(value, float) and not math.isfinite(value):
        raise FieldTypeError(f"must be a finite number, got {value}")
    if isinstance(value, int) and not -INT64 < value < INT64:
        raise FieldTypeError(f"{value} does not fit in 64 bits")
    if field.limits is not None and (problem := field.limits.problem(value)):
        raise FieldTypeError(problem)
    return value


def _checked_choice(field: Field, value: str) -> str:
    if field.choices is not None and value not in field.choices:
        raise FieldTypeError(f"expected {field.describe_type()}, got {value!r}{_closest(value, field.choices)}")
    if field.name in HOST_FIELDS and not is_host(value):
        raise FieldTypeError(f"{value!r} is neither an IP address nor a host name; give machine rank 0's address, "
                             "like 10.0.0.1 or gpu01")
    return value


HOST_FIELDS = ("main_process_ip",)  # the ranks' rendezvous resolves it, long after launch: check its form here
_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)")  # RFC 1123, and `_` as /etc/hosts allows


def is_host(text: str) -> bool:
    """An IPv4 or IPv6 address, or a host name (dot-separated labels of letters, digits and inner hyphens)."""
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        pass
    name = text[:-1] if text.endswith(".") else text
    return 0 < len(name) <= 253 and all(_HOST_LABEL.fullmatch(label) for label in name.split("."))


def _closest(value: str, choices: tuple[Any, ...]) -> str:
    close = difflib.get_close_matches(value, [c for c in choices if isinstance(c, str)], n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


_INTEGER = re.compile(r"[+-]?\d+")


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def coerce(field: Field, value: Any) -> Any:
    """Check `value` against the field's type, choices and range; return it in the form TRL expects."""
    kinds = field.kinds
    if "any" in kinds:
        return value
    if value is None:
        if "null" in kinds:
            return None
        raise FieldTypeError(f"expected {field.describe_type()}, got null")
    if isinstance(value, bool):
        if field.name in TRL_BOOL_MEANINGS:
            return TRL_BOOL_MEANINGS[field.name][value]
        if "bool" in kinds:
            return value
    elif isinstance(value, int) and "int" in kinds:
        return _checked_number(field, value)
    elif isinstance(value, (int, float)) and "float" in kinds:
        return _checked_number(field, value)
    elif isinstance(value, str) and "str" not in kinds and "int" in kinds and _INTEGER.fullmatch(value.strip()):
        return _checked_number(field, int(value))  # a flag's text, or a quoted number as TRL's parser takes it
    elif isinstance(value, str) and "float" in kinds and "str" not in kinds and (number := _float(value)) is not None:
        return _checked_number(field, number)  # YAML 1.1 reads `3e-6` (no dot) as a string
    elif isinstance(value, list) and "list" in kinds:
        for item in value if field.choices is not None else ():
            if not isinstance(item, str) or item not in field.choices:
                raise FieldTypeError(f"{item!r} is not one of {choices_text(field.choices)}"
                                     f"{_closest(item, field.choices) if isinstance(item, str) else ''}")
        for item in value:  # finite, and in range: online DPO's `beta` (one per epoch), GRPO's `reward_weights`
            if isinstance(item, (int, float)) and not isinstance(item, bool):
                _checked_number(field, item)
        return value
    elif isinstance(value, dict) and "dict" in kinds:
        return value
    if isinstance(value, str) and "str" in kinds:
        return _checked_choice(field, value)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and "str" in kinds and field.choices is None:
        return str(value)
    if "list" in kinds and isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return coerce(field, [value])  # a single reward function or report target written without brackets
    got = "null" if value is None else type(value).__name__
    hint = _quote_hint(field, value) if isinstance(value, bool) else ""
    raise FieldTypeError(f"expected {field.describe_type()}, got {value!r} ({got}){hint}")
