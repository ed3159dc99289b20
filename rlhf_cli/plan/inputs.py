"""A resolved run -> what the plan's arithmetic reads from it, once: the models by role (sizes, LoRA adapters), the
workload, the hardware and ZeRO-3's settings; or why it cannot be read (not ZeRO-3, a model or the GPUs unsized).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from rlhf_cli.algorithms import algorithm
from rlhf_cli.config.accelerate import is_zero3
from rlhf_cli.config.run import ResolvedRun
from rlhf_cli.generation.choice import Gather
from rlhf_cli.generation.sync_buckets import bucket_limit, bucket_sizes
from rlhf_cli.machine.corrections import remembered as remembered_corrections
from rlhf_cli.models.architectures import peft_targets
from rlhf_cli.models.hub import ModelConfigUnavailable, read_config
from rlhf_cli.plan import memory
from rlhf_cli.plan.columns import Role
from rlhf_cli.plan.hardware import Hardware, detect_gpu, detect_hardware
from rlhf_cli.plan.model_sizes import LoraSettings, adapter_size, model_size
from rlhf_cli.plan.workload import Workload, WorkloadUnknown, workload
from rlhf_cli.sizes import SizeError, parse_size


@dataclass(frozen=True)
class Inputs:
    """Everything the arithmetic needs, read once from the run."""

    algorithm: str
    roles: list[Role]
    work: Workload
    hardware: Hardware
    max_live: int
    zero_init: bool
    value: Callable[[str], Any]
    mask_bytes: int  # per element of a LoRA dropout mask: CUDA's is bool, the CPU's has the model's dtype

    def role(self, name: str) -> Role | None:
        return next((role for role in self.roles if role.name == name), None)

    @property
    def persistence_threshold(self) -> int | None:
        """The run's stage3_param_persistence_threshold (None: DeepSpeed's default): below it ZeRO-3 keeps a
        parameter whole on every rank (`Rates.per_module`)."""
        return self.value("stage3_param_persistence_threshold")

    def sync_buckets(self, gather: Gather, lora: bool, adapters_alone: bool = False) -> list[tuple[int, int, int]]:
        """(elements, modules, how many alike) of the buckets one weight sync gathers (the ranks' packing of the
        policy's units under the gather choice's limit); under LoRA each unit holds its adapters too, merged in its
        bucket, or only them (`adapters_alone`: a generator that serves them, after the first sync)."""
        policy, adapter = self.roles[0].size, self.roles[0].adapter
        adapted = adapter.params if lora and adapter else 0
        synced = adapted if adapters_alone and adapted else policy.params + adapted
        parts = [(part.unit.numel * synced // policy.params, part.unit.modules, part.count)
                 for part in policy.stretches] or [(synced, policy.layers, 1)]
        return bucket_sizes(parts, bucket_limit(gather, policy.params, self.work.element_bytes))


def lora_settings(value: Callable[[str], Any]) -> LoraSettings:
    """The run's LoRA keys, as the ranks pass them to PEFT; LoRA columns use them whether the run sets use_peft."""
    return LoraSettings(value("lora_r"), peft_targets(value("lora_target_modules")),
                        tuple(value("lora_modules_to_save") or ()), value("lora_dropout") > 0, bool(value("use_dora")))


def _roles(run: ResolvedRun) -> list[Role]:
    revision = run.value("model_revision")
    lora = lora_settings(run.value)

    def role(name: str, path: str, classifier: bool, trained: bool) -> Role:
        config = read_config(path, revision, run.value("env"))  # the ranks' HF_HUB_CACHE / HF_HOME
        size = model_size(config, sequence_classifier=classifier)
        return Role(name, path, size, trained, adapter_size(config, lora, sequence_classifier=classifier)
                    if trained else None)

    entry = algorithm(run.algorithm)
    policy_path = run.value("model_name_or_path")
    reward_path = run.value("reward_model_name_or_path")
    roles = [role("policy", policy_path, False, True)]
    if entry.has_reference(run.value):
        roles.append(Role("reference", policy_path, roles[0].size, False))
    if reward_path:
        roles.append(role("reward", reward_path, True, False))
    if entry.trains_value_model:
        value_path = run.value("value_model_name_or_path") or reward_path or policy_path
        roles.append(role("value", value_path, True, True))
    return roles


def _hardware(run: ResolvedRun) -> Hardware | str:
    """The memory per GPU: `--gpu-memory`, else the memory of the GPU `--gpu` names (as sold), else nvidia-smi's or
    this machine's RAM."""
    given = run.value("gpu_memory")
    machines = int(run.accelerate.get("num_machines") or 1)
    processes = int(run.accelerate.get("num_processes") or 1)
    gpu, source = detect_gpu(run.value("gpu"), run.value("hardware_file"), run.value("interconnect"),
                             run.value("network"), max(1, processes // max(1, machines)))
    if given is not None:
        hardware = detect_hardware(parse_size(given), processes, machines)
    elif gpu is not None and gpu.memory and run.value("gpu") is not None:
        hardware = detect_hardware(gpu.memory, processes, machines, f"--gpu {run.value('gpu')}: {gpu.name}'s "
                                   f"{gpu.memory / 1e9:g} GB as sold (--gpu-memory to say otherwise)")
    else:
        hardware = detect_hardware(None, processes, machines)
    if isinstance(hardware, str):
        return hardware
    hardware = replace(hardware, gpu=gpu, gpu_source=source)
    kept = remembered_corrections(gpu.name) if gpu is not None and hardware.this_machine else {}
    return replace(hardware, corrections=kept,
                   gpu_source=f"{source}; corrected by a rehearsal here: {_factors(kept)}" if kept else source)


def _factors(kept: dict[str, float]) -> str:
    return ", ".join(f"{phase} x{factor:.3g}" for phase, factor in kept.items())


def read_inputs(run: ResolvedRun) -> Inputs | str:
    """The planner's inputs, or why there are none."""
    if not is_zero3(run.accelerate):
        return "the accelerate config is not DeepSpeed ZeRO-3, which is all rlhf plan models"
    try:
        roles = _roles(run)
        hardware = _hardware(run)
        if isinstance(hardware, str):
            return hardware
        work = workload(run.algorithm, run.value, hardware.total_gpus, roles[0].size.max_positions)
    except (ModelConfigUnavailable, SizeError, WorkloadUnknown) as error:
        return str(error)
    deepspeed = run.accelerate.get("deepspeed_config") or {}
    return Inputs(
        run.algorithm, roles, work, hardware,
        max_live=run.value("stage3_max_live_parameters") or memory.DEFAULT_MAX_LIVE_PARAMETERS,
        zero_init=bool(deepspeed.get("zero3_init_flag", False)), value=run.value,
        mask_bytes=work.element_bytes if run.cpu_only else 1)
