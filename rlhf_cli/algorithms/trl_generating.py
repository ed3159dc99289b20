"""What RLOO and GRPO share: TRL 1.x's generation batching (`generation_batch_size`, `steps_per_generation`)
and groups of `num_generations` completions per prompt."""

from __future__ import annotations

from rlhf_cli.algorithms.spec import Batches, LogitsModel, Values

# trl/trainer/{rloo,grpo}_trainer.py: `add_fused_lm_head` scores only the completion tokens, in tiles, whatever
# `use_liger_kernel` says (TRL turns Liger's fused cross-entropy off)
FUSED_HEAD = LogitsModel(fused_head=True)


def generation_batches(values: Values, num_processes: int) -> Batches:
    """Per process: the generation batch covers `steps_per_generation` micro-batches (default: the accumulation)."""
    per_device = values("per_device_train_batch_size")
    total = values("generation_batch_size")
    steps = values("steps_per_generation") or values("gradient_accumulation_steps")
    generation = total // num_processes if total else per_device * steps
    return Batches(generation=generation, train=per_device, score=per_device)


def group_checks(values: Values, num_processes: int) -> list[str]:
    """The generation batch over all processes holds whole groups of `num_generations` (TRL checks it at start-up,
    on every rank; here it is found before anything starts)."""
    per_device, generations = values("per_device_train_batch_size"), values("num_generations")
    total, steps = values("generation_batch_size"), values("steps_per_generation")
    if not isinstance(per_device, int) or per_device < 1 or not isinstance(generations, int):
        return []  # a value outside its range is reported by the range checks
    if total is not None and steps is not None:
        return ["`generation_batch_size` and `steps_per_generation` cannot both be set; keep one"]
    if generations < 2:
        return [f"`num_generations` must be at least 2 (a group needs another completion to compare with), "
                f"got {generations}"]
    global_batch = per_device * num_processes
    if total is not None:
        if total % global_batch:
            return [f"`generation_batch_size` ({total}) must be a multiple of per_device_train_batch_size x "
                    f"processes ({per_device} x {num_processes} = {global_batch})"]
    else:
        total = global_batch * (steps or values("gradient_accumulation_steps"))
    if total % generations:
        fitting = [d for d in range(2, generations) if total % d == 0]
        instead = f"set num_generations to {fitting[-1]}, or " if fitting else "set "
        return [f"`num_generations` ({generations}) must divide the generation batch ({total} = "
                f"per_device_train_batch_size x processes x steps per generation): {instead}"
                f"per_device_train_batch_size to a multiple of {generations}"]
    return []
