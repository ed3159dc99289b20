"""PPO: rlhf's own trainer (TRL deleted its PPOTrainer in 1.13), with TRL's former PPOConfig field names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlhf_cli.algorithms.legacy import COMMON_RENAMED, COMMON_RETIRED
from rlhf_cli.algorithms.spec import Algorithm, Batches, LogitsModel, StarterEntry, StepWork, Values
from rlhf_cli.generation.choice import Engine
from rlhf_cli.generation.engines import USE_VLLM_KEY
from rlhf_cli.models.hub import local_config, local_config_file
from rlhf_cli.output.files import read_json


def _batches(values: Values, num_processes: int) -> Batches:
    # As in TRL 1.12: a process's rollouts per update, split into num_mini_batches
    rollouts = values("per_device_train_batch_size") * values("gradient_accumulation_steps")
    generation = min(values("local_rollout_forward_batch_size"), rollouts)
    return Batches(generation=generation, train=values("per_device_train_batch_size"), score=generation)


def _step_work(values: Values) -> StepWork:
    """One update generates a process's rollouts, then takes num_ppo_epochs x num_mini_batches optimizer steps over
    them (rlhf_cli/rank/ppo/trainer.py); the policy's log-probs of the rollouts are taken once per update."""
    rollouts = values("per_device_train_batch_size") * values("gradient_accumulation_steps")
    steps = (values("num_ppo_epochs") or 1) * (values("num_mini_batches") or 1)
    return StepWork(generated=rollouts / steps, trained=rollouts // (values("num_mini_batches") or 1),
                    old_logprobs=True, old_logprobs_with_vllm=True, syncs=1 / steps)


def _json(path: Path) -> dict[str, Any]:
    """A JSON object from a model's files; {} where there is none."""
    loaded = read_json(path)
    return loaded if isinstance(loaded, dict) else {}


def _token_name(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or an AddedToken's {"content": ...}."""
    return value.get("content") if isinstance(value, dict) else value if isinstance(value, str) else None


def resized_for_pad(policy: Path) -> tuple[int, int] | None:
    """(embedding rows, rows after resizing) when the ranks will add a pad token to the local `policy` and resize
    its embedding for it (rlhf_cli/rank/loading.py: no pad token, or pad = EOS, and no spare row); None when not,
    or when its tokenizer files cannot be read."""
    tokenizer = {**_json(policy / "special_tokens_map.json"), **_json(policy / "tokenizer_config.json")}
    pad, eos = _token_name(tokenizer.get("pad_token")), _token_name(tokenizer.get("eos_token"))
    if pad is not None and pad != eos:
        return None
    vocab = _json(policy / "tokenizer.json").get("model", {}).get("vocab")
    rows = local_config(policy).get("vocab_size")
    if not vocab or not isinstance(rows, int):
        return None
    ids = set(vocab.values()) if isinstance(vocab, dict) else set(range(len(vocab)))
    ids |= {token.get("id") for token in _json(policy / "tokenizer.json").get("added_tokens") or []}
    return (rows, len(ids) + 1) if len(ids) + 1 > rows else None


def importance_sampling_problems(values: Values) -> list[str]:
    """The bounds of vLLM's importance sampling as TRL's GRPOConfig checks them: clip_min below clip_max, and a
    `*_truncate` mode with at least one of them."""
    low, high = values("vllm_importance_sampling_clip_min"), values("vllm_importance_sampling_clip_max")
    if low is not None and high is not None and low >= high:
        return [f"`vllm_importance_sampling_clip_min` ({low}) must be less than `vllm_importance_sampling_clip_max` "
                f"({high})"]
    mode = values("vllm_importance_sampling_mode")
    unbounded = low is None and high is None
    if values("vllm_importance_sampling_correction") and str(mode).endswith("_truncate") and unbounded:
        return [f"`vllm_importance_sampling_mode: {mode}` clips the importance-sampling ratios and neither "
                "`vllm_importance_sampling_clip_min` nor `vllm_importance_sampling_clip_max` is set: set one"]
    return []


def _checks(values: Values, num_processes: int) -> list[str]:
    """Batch sizes that tile, one stop token setting, a tokenizer with EOS, a stop token inside the vocabulary (each
    size is at least 1 by then: rlhf_cli/schema/ranges.yaml), no vLLM on a policy the ranks resize."""
    problems = []
    per_device, accumulation = values("per_device_train_batch_size"), values("gradient_accumulation_steps")
    mini_batches, chunk = values("num_mini_batches"), values("local_rollout_forward_batch_size")
    local_batch = per_device * accumulation  # split into num_mini_batches, as in TRL 1.12
    if local_batch % mini_batches:
        problems.append(f"`num_mini_batches` ({mini_batches}) must divide the rollouts per process "
                        f"(per_device_train_batch_size x gradient_accumulation_steps = {local_batch}): each "
                        "mini-batch is one optimizer step")
    if local_batch % min(chunk, local_batch):
        problems.append(f"`local_rollout_forward_batch_size` ({chunk}) must divide the rollouts per process "
                        f"(per_device_train_batch_size x gradient_accumulation_steps = {local_batch})")
    if values("stop_token") is not None and values("stop_token_id") is not None:
        problems.append(f"`stop_token` ({values('stop_token')}) and `stop_token_id` ({values('stop_token_id')}) are "
                        "both set; keep one")
    episodes = values("total_episodes")
    batch = local_batch * num_processes
    if episodes is not None and episodes < batch:
        problems.append(f"`total_episodes` ({episodes}) is less than one batch of rollouts ({local_batch} per process "
                        f"x {num_processes} processes = {batch})")

    problems += importance_sampling_problems(values)
    policy = values("model_name_or_path")
    if not isinstance(policy, str) or local_config_file(policy) is None:
        return problems
    tokenizer = _json(Path(policy, "tokenizer_config.json"))
    if tokenizer and not tokenizer.get("eos_token"):  # a missing pad token is added when the ranks load it
        problems.append(f"`model_name_or_path`: the tokenizer in {policy} has no eos_token; PPO needs one")
    vocab_size = local_config(policy).get("vocab_size")
    stop = values("stop_token_id")
    if stop is not None and vocab_size is not None and not 0 <= stop < vocab_size:
        problems.append(f"`stop_token_id` {stop} is not in the vocabulary of {policy} (0..{vocab_size - 1})")
    resized = resized_for_pad(Path(policy)) if Engine.from_values(values).separate else None
    if resized:
        problems.append(f"`{USE_VLLM_KEY}`: {policy} has no pad token of its own and no spare embedding row, so PPO "
                        f"adds one and resizes the embedding from {resized[0]} to {resized[1]} rows, while vLLM loads "
                        "the checkpoint's rows and its weight sync cannot change a shape; save the policy with a pad "
                        "token first (add_special_tokens, resize_token_embeddings, save_pretrained) or drop --vllm")
    return problems


ALGORITHM = Algorithm(
    name="ppo",
    command="ppo",
    summary="Train with PPO (rlhf's own trainer): a value model, GAE and a per-token KL penalty.",
    example="rlhf ppo -r ppo/smoke --no-gather",
    config_name="rlhf's PPO (named as in TRL's former PPOConfig)",
    config_class="rlhf_cli.rank.ppo.config:PPOConfig",
    script_class="trl.scripts.rloo:RLOOScriptArguments",
    builder="rlhf_cli.rank.builders:build_ppo",
    sync_hooks={"vllm": "rlhf_cli.rank.engines.vllm.sync:hook_vllm_generation"},
    trainer_class="rlhf_cli.rank.ppo.trainer:PPOTrainer",
    completion_field="response_length",
    batch_fields=("local_rollout_forward_batch_size", "per_device_train_batch_size"),
    batches=_batches,
    step_work=_step_work,
    has_reference=lambda values: True,
    trains_value_model=True,
    # rlhf_cli/rank/ppo/trainer.py: `output.logits` over every position stays referenced through the backward,
    # with the completion's scaled logits and log-softmax; the backward adds a completion gradient or two and,
    # through the slice, one over every position: at most 2 [sequence] and 4 [completion] copies at once
    logits=LogitsModel(sequence_copies=2, completion_copies=4),
    headline_metrics=(("objective/scores", "score"), ("objective/kl", "kl"), ("loss/policy_avg", "loss"),
                      ("loss/value_avg", "value loss")),
    # TRL 1.16 deprecated `vllm_importance_sampling_cap` for `vllm_importance_sampling_clip_max` (its GRPOConfig)
    renamed={**COMMON_RENAMED, "vllm_importance_sampling_cap": "vllm_importance_sampling_clip_max"},
    retired=COMMON_RETIRED,
    starter_models=(StarterEntry("value_model_name_or_path", "the value model's start; default: the reward model",
                                 "./my-value-model", enabled=False),),
    starter=(
        StarterEntry("total_episodes", "responses to train on in total", 10000),
        StarterEntry("response_length", "most tokens generated per response", 256),
        StarterEntry("stop_token", "eos: cut responses after the first EOS token", "eos"),
        StarterEntry("missing_eos_penalty", "subtracted from the score of unfinished responses", 1.0),
        StarterEntry("per_device_train_batch_size", "rollouts per GPU per micro-batch", 4),
        StarterEntry("gradient_accumulation_steps", "micro-batches per update: rollouts per GPU = this x the above",
                     4),
        StarterEntry("num_mini_batches", "optimizer steps per pass over the rollouts; divides rollouts per GPU", 1),
        StarterEntry("local_rollout_forward_batch_size", "sequences per generation pass; divides rollouts per GPU",
                     16),
        StarterEntry("num_ppo_epochs", "passes over each batch of rollouts"),
        StarterEntry("learning_rate", "AdamW learning rate"),
        StarterEntry("kl_coef", "weight of the per-token KL penalty (vs. the reference)"),
        StarterEntry("kl_estimator", "k1 (log-ratio) or k3 (unbiased, non-negative)"),
        StarterEntry("cliprange", "clip range of the policy ratio"),
        StarterEntry("vf_coef", "weight of the value loss"),
        StarterEntry("temperature", "sampling temperature of rollouts"),
    ),
    checks=_checks,
    reward_keywords=("prompts", "completions", "completion_ids"),  # rlhf_cli/rank/ppo/trainer.py's _score
)
