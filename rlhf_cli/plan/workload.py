"""What a run generates and trains on, per process: lengths, batch sizes and kernels read from the trainer's fields.

What differs per trainer comes from its registry entry (rlhf_cli/algorithms): which fields give the batches and
the completion length, and how the trainer scores tokens (`logits`). None of the generating trainers has a
padding-free mode in TRL 1.16 (only SFT and DPO do), so every batch is padded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from rlhf_cli.algorithms import algorithm
from rlhf_cli.algorithms.spec import LogitsModel
from rlhf_cli.plan.memory import SDPA

DEFAULT_PROMPT_LENGTH = 512  # tokens, when the recipe does not say (`plan_prompt_length`) nor the model limits it
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}


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
    attention: str  # attn_implementation; transformers picks sdpa when the recipe does not say
    liger: bool  # use_liger_kernel: Liger's RMSNorm and SwiGLU kernels in every decoder layer
    logits: LogitsModel  # how the trainer scores tokens

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def element_bytes(name: str, value: Callable[[str], Any]) -> int:
    """2 under bf16/fp16 mixed precision (TRL's configs turn bf16 on unless told), else the dtype's."""
    bf16, fp16 = value("bf16"), value("fp16")
    if fp16 or bf16 or (bf16 is None and algorithm(name).bf16_unless_told):
        return 2
    return DTYPE_BYTES.get(str(value("dtype")), 4)


def workload(name: str, value: Callable[[str], Any], num_processes: int,
             max_positions: int | None = None) -> Workload:
    """The run's per-process lengths and batches; `value(key)` reads a resolved recipe key."""
    entry = algorithm(name)
    completion = value(entry.completion_field)
    if completion is None:
        raise WorkloadUnknown(f"`{entry.completion_field}` is null; the plan needs a completion length")
    default_prompt = min(DEFAULT_PROMPT_LENGTH, max(1, max_positions - completion)) if max_positions \
        else DEFAULT_PROMPT_LENGTH
    prompt = value("plan_prompt_length") or default_prompt
    sequence = prompt + completion
    if entry.sequence_cap_field:
        sequence = min(sequence, value(entry.sequence_cap_field))
    batches = entry.batches(value, num_processes)
    checkpointing = value("activation_checkpointing")  # transformers 5's name; the old one is its alias
    if checkpointing is None:
        checkpointing = value("gradient_checkpointing")
    return Workload(prompt, completion, batches.generation, batches.train, batches.score, sequence,
                    bool(checkpointing), element_bytes(name, value), value("attn_implementation") or SDPA,
                    bool(value("use_liger_kernel")), entry.logits)


def tool_note(name: str, value: Callable[[str], Any], work: Workload) -> str | None:
    """With tools, say what the lengths hold: TRL appends each tool result to the completion and stops it at
    `max_completion_length`, so prompt + completion still bounds every sequence; the prompt holds the tools'
    schemas, which only the recipe's `plan_prompt_length` can tell."""
    if not algorithm(name).takes_tools or not (value("tools") or value("environment_factory")):
        return None
    prompt = f"{work.prompt_length} tokens" + ("" if value("plan_prompt_length") else
                                               ", the default: set plan_prompt_length to the prompt as rendered")
    return (f"tools: sequences counted as prompt ({prompt}, tools' schemas included) + completion "
            f"({work.completion_length} tokens: generated text and tool results together, as TRL caps them)")
