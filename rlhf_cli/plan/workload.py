"""What a run generates and trains on, per process: lengths and batch sizes read from the trainer's fields."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

DEFAULT_PROMPT_LENGTH = 512  # tokens, when the recipe does not say (`plan_prompt_length`) nor the model limits it
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}
COMPLETION_FIELD = {"ppo": "response_length", "rloo": "max_completion_length", "online_dpo": "max_new_tokens"}
BATCH_FIELDS = {"ppo": ("local_rollout_forward_batch_size", "per_device_train_batch_size"),
                "rloo": ("per_device_train_batch_size",), "online_dpo": ("per_device_train_batch_size",)}


class WorkloadUnknown(Exception):
    """A length the plan needs is not set; the message names the key."""


@dataclass(frozen=True)
class Workload:
    prompt_length: int
    completion_length: int
    generation_batch: int  # sequences generated together on one process
    train_batch: int  # sequences in one training micro-batch
    score_batch: int  # sequences in one no-grad scoring forward pass
    train_sequence: int  # tokens per training sequence
    gradient_checkpointing: bool
    element_bytes: int  # bytes per parameter or activation element as the run trains

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def element_bytes(algorithm: str, value: Callable[[str], Any]) -> int:
    """2 under bf16/fp16 mixed precision (TRL's RLOO and online DPO turn bf16 on unless told), else the dtype's."""
    bf16, fp16 = value("bf16"), value("fp16")
    if fp16 or bf16 or (bf16 is None and algorithm != "ppo"):
        return 2
    return DTYPE_BYTES.get(str(value("dtype")), 4)


def workload(algorithm: str, value: Callable[[str], Any], num_processes: int,
             max_positions: int | None = None) -> Workload:
    """The run's per-process lengths and batches; `value(name)` reads a resolved recipe key."""
    per_device = value("per_device_train_batch_size")
    completion = value(COMPLETION_FIELD[algorithm])
    if completion is None:
        raise WorkloadUnknown(f"`{COMPLETION_FIELD[algorithm]}` is null; the plan needs a completion length")
    default_prompt = min(DEFAULT_PROMPT_LENGTH, max(1, max_positions - completion)) if max_positions \
        else DEFAULT_PROMPT_LENGTH
    prompt = value("plan_prompt_length") or default_prompt
    sequence = prompt + completion
    if algorithm == "ppo":
        rollouts = per_device * value("gradient_accumulation_steps")  # split into num_mini_batches
        generation = min(value("local_rollout_forward_batch_size"), rollouts)
        train, score = per_device, generation
    elif algorithm == "rloo":
        total = value("generation_batch_size")
        steps = value("steps_per_generation") or value("gradient_accumulation_steps")
        generation = total // num_processes if total else per_device * steps
        train, score = per_device, per_device
    else:  # online DPO: two completions per prompt, trained on together
        generation = train = score = 2 * per_device
        sequence = min(sequence, value("max_length"))
    return Workload(prompt, completion, generation, train, score, sequence,
                    # transformers 5 reads either name (gradient_checkpointing is the deprecated one)
                    bool(value("activation_checkpointing") or value("gradient_checkpointing")),
                    element_bytes(algorithm, value))
