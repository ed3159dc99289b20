"""Every key a recipe may hold, with its type, default and help, read without importing TRL.

TRL's fields come from the JSON snapshots in `rlhf_cli/schema/`; the keys that TRL's recipe
format lacks (how to launch, what to offload, ZeRO-3 tuning) are declared here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import cache
from importlib import resources
from typing import Any

OFFLOAD_DEVICES = ("none", "cpu", "nvme")
# `auto`: let the memory plan choose (rlhf_cli/plan); resolution turns it into true or false.
GATHER_CHOICES = (True, False, "auto")


@dataclass(frozen=True)
class Field:
    """One recipe key. `group` says who consumes it: TRL's script, model or trainer
    arguments, our launcher (`launch`), or the DeepSpeed ZeRO-3 section (`zero3`)."""

    name: str
    group: str
    kinds: tuple[str, ...]
    default: Any
    help: str
    choices: tuple[Any, ...] | None = None

    def describe_type(self) -> str:
        if self.choices is not None:
            return "one of " + ", ".join(json.dumps(c) if isinstance(c, bool) else str(c) for c in self.choices)
        names = {"str": "a string", "int": "an integer", "float": "a number", "bool": "true or false",
                 "list": "a list", "dict": "a mapping", "null": "null", "any": "any value"}
        return " or ".join(names[kind] for kind in self.kinds)


# Keys TRL's recipe format lacks. They sit at the top level of a recipe next to TRL's keys.
OWN_FIELDS = (
    Field("gather", "launch", ("bool", "str", "null"), None,
          "Gather the whole policy on every rank to generate (TRL's ds3_gather_for_generation); "
          "auto: gather when the memory plan says it fits.", GATHER_CHOICES),
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
    Field("plan_prompt_length", "launch", ("int", "null"), None,
          "Longest prompt in tokens, as the memory plan assumes it; default 512."),
    Field("accelerate_config", "launch", ("str", "null"), None,
          "Your own accelerate config to start from instead of the bundled ZeRO-3 one."),
    Field("dataset_prompt_column", "script", ("str",), "prompt",
          "Dataset column holding the prompt (plain text or a list of chat messages)."),
    Field("stage3_prefetch_bucket_size", "zero3", ("int", "null"), None,
          "ZeRO-3: parameter elements fetched ahead of use; default: DeepSpeed's (5e7)."),
    Field("stage3_param_persistence_threshold", "zero3", ("int", "null"), None,
          "ZeRO-3: parameters smaller than this stay whole on every rank; default: DeepSpeed's (1e5)."),
    Field("stage3_max_live_parameters", "zero3", ("int", "null"), None,
          "ZeRO-3: most parameter elements kept gathered at once; default: DeepSpeed's (1e9)."),
)


@cache
def _snapshot(algorithm: str) -> dict[str, Any]:
    return json.loads(resources.files("rlhf_cli.schema").joinpath(f"{algorithm}.json").read_text())


def trl_reward_functions(algorithm: str) -> tuple[str, ...]:
    return tuple(_snapshot(algorithm)["reward_functions"])


@cache
def catalogue(algorithm: str) -> dict[str, Field]:
    """All recipe keys for one algorithm, TRL's and ours."""
    snapshot = _snapshot(algorithm)
    fields = {
        name: Field(name, spec["group"], tuple(spec["kinds"]), spec["default"], spec["help"],
                    tuple(spec["choices"]) if "choices" in spec else None)
        for name, spec in snapshot["fields"].items()
    }
    fields.update({field.name: field for field in OWN_FIELDS})
    gather = fields["ds3_gather_for_generation"]
    fields[gather.name] = replace(gather, kinds=(*gather.kinds, "str"), choices=GATHER_CHOICES)
    return fields


class FieldTypeError(ValueError):
    """A value that does not fit its field; the message says what was expected."""


def coerce(field: Field, value: Any) -> Any:
    """Check `value` against the field's type and return it in the form TRL expects."""
    kinds = field.kinds
    if "any" in kinds:
        return value
    if value is None:
        if "null" in kinds:
            return None
        raise FieldTypeError(f"expected {field.describe_type()}, got null")
    if isinstance(value, bool):
        if "bool" in kinds:
            return value
    elif isinstance(value, int) and "int" in kinds:
        return value
    elif isinstance(value, (int, float)) and "float" in kinds:
        return value
    elif isinstance(value, str) and "float" in kinds and "str" not in kinds:
        try:  # YAML 1.1 reads `3e-6` (no dot) as a string
            return float(value)
        except ValueError:
            pass
    elif isinstance(value, list) and "list" in kinds:
        return value
    elif isinstance(value, dict) and "dict" in kinds:
        return value
    if isinstance(value, str) and "str" in kinds:
        if field.choices is not None and value not in field.choices:
            raise FieldTypeError(f"expected {field.describe_type()}, got {value!r}")
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool) and "str" in kinds and field.choices is None:
        return str(value)
    if "list" in kinds and isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return [value]  # a single reward function or report target written without brackets
    got = "null" if value is None else type(value).__name__
    raise FieldTypeError(f"expected {field.describe_type()}, got {value!r} ({got})")
