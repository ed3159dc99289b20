"""What RLOO and GRPO share: TRL 1.x's generation batching (`generation_batch_size`, `steps_per_generation`)
and groups of `num_generations` completions per prompt."""

from __future__ import annotations

from rlhf_cli.algorithms.spec import Batches, LogitsModel, StepWork, Values

# trl/trainer/{rloo,grpo}_trainer.py: `add_fused_lm_head` scores only the completion tokens, in tiles, whatever
# `use_liger_kernel` says (TRL turns Liger's fused cross-entropy off)
FUSED_HEAD = LogitsModel(fused_head=True)

# RLOOTrainer and GRPOTrainer call each reward function with these (and every other dataset column).
TRL_REWARD_KEYWORDS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric")


def generation_batches(values: Values, num_processes: int) -> Batches:
    """Per process: the generation batch covers `steps_per_generation` micro-batches (default: the accumulation)."""
    per_device = values("per_device_train_batch_size")
    total = values("generation_batch_size")
    steps = values("steps_per_generation") or values("gradient_accumulation_steps")
    generation = total // num_processes if total else per_device * steps
    return Batches(generation=generation, train=per_device, score=per_device)


def micro_batches_per_round(values: Values) -> int:
    """Micro-batches between two generation rounds (`generate_every` in TRL's trainers): `steps_per_generation`
    (default: the accumulation) x `num_iterations`."""
    return (values("steps_per_generation") or values("gradient_accumulation_steps") or 1) * (values("num_iterations")
                                                                                            or 1)


def _step_work(values: Values, old_logprobs: bool | None, old_logprobs_with_vllm: bool) -> StepWork:
    """An optimizer step trains gradient_accumulation_steps micro-batches; each generated batch is trained on
    `num_iterations` times (`generate_every` in TRL's trainers); `old_logprobs` None: when generation and optimizer
    steps do not align."""
    accumulation, iterations = values("gradient_accumulation_steps"), values("num_iterations") or 1
    trained = values("per_device_train_batch_size") * accumulation
    every = micro_batches_per_round(values)
    aligned = accumulation % every == 0
    return StepWork(generated=trained / iterations, trained=trained,
                    old_logprobs=not aligned if old_logprobs is None else old_logprobs,
                    old_logprobs_with_vllm=old_logprobs_with_vllm or not aligned, syncs=min(1.0, accumulation / every))


def rloo_step_work(values: Values) -> StepWork:
    """RLOOTrainer always takes the old log-probs (trl/trainer/rloo_trainer.py)."""
    return _step_work(values, True, True)


def grpo_step_work(values: Values) -> StepWork:
    """GRPOTrainer takes them when steps do not align, and with vLLM for its importance-sampling correction."""
    return _step_work(values, None, bool(values("vllm_importance_sampling_correction")))


def group_checks(values: Values, num_processes: int) -> list[str]:
    """The generation batch over all processes holds whole groups of `num_generations`, and so does the evaluation
    batch when evaluating (TRL checks both at start-up, on every rank; here they are found before anything starts).
    Ranges (num_generations at least 2, batch sizes at least 1) are checked before, from rlhf_cli/schema/ranges.yaml.
    """
    per_device, generations = values("per_device_train_batch_size"), values("num_generations")
    total, steps = values("generation_batch_size"), values("steps_per_generation")
    if generations is None:
        return ["`num_generations` must be set: completions per prompt, at least 2"]
    if total is not None and steps is not None:
        return ["`generation_batch_size` and `steps_per_generation` cannot both be set; keep one"]
    problems = []
    global_batch = per_device * num_processes
    if total is not None and total % global_batch:
        return [f"`generation_batch_size` ({total}) must be a multiple of per_device_train_batch_size x "
                f"processes ({per_device} x {num_processes} = {global_batch})"]
    total = total if total is not None else global_batch * (steps or values("gradient_accumulation_steps"))
    if total % generations:
        fitting = [d for d in range(2, generations) if total % d == 0]
        instead = f"set num_generations to {fitting[-1]}, or " if fitting else "set "
        problems.append(f"`num_generations` ({generations}) must divide the generation batch ({total} = "
                        f"per_device_train_batch_size x processes x steps per generation): {instead}"
                        f"per_device_train_batch_size to a multiple of {generations}")
    if values("eval_strategy") != "no":
        eval_generations = values("num_generations_eval") or generations
        eval_batch = values("per_device_eval_batch_size") * num_processes
        if eval_batch % eval_generations:
            problems.append(f"the evaluation batch (per_device_eval_batch_size x processes = {eval_batch}) must be a "
                            f"multiple of num_generations_eval or num_generations ({eval_generations}): set "
                            "per_device_eval_batch_size to a multiple of it")
    return problems
