"""Checks that need a look at local model files or at several keys together; no model is loaded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable


def _json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _local(path: Any) -> Path | None:
    return Path(path) if isinstance(path, str) and Path(path, "config.json").is_file() else None


# Sequence classifiers, and causal LMs (GPT-2's is named GPT2LMHeadModel) loaded as one with a new score head.
SCORABLE_ARCHITECTURES = ("ForSequenceClassification", "ForCausalLM", "LMHeadModel")


def check_reward_model(value: Any, problems: list[str]) -> None:
    """A local reward model must be a sequence classifier, or a causal LM that the ranks load as one with a new
    score head (as the seed's pythia-70m); hub ids are loaded the same way."""
    path = _local(value)
    architectures = (_json(path / "config.json").get("architectures") or []) if path else []
    if architectures and not any(a.endswith(SCORABLE_ARCHITECTURES) for a in architectures):
        problems.append(f"`reward_model_name_or_path`: {path} is a {architectures[0]}, neither a sequence classifier "
                        "nor a causal LM (save it with AutoModelForSequenceClassification, num_labels=1)")


def check_ppo(value: Callable[[str], Any], num_processes: int, problems: list[str]) -> None:
    """Batch sizes that tile, a tokenizer with EOS, a stop token inside the vocabulary."""
    per_device, accumulation = value("per_device_train_batch_size"), value("gradient_accumulation_steps")
    mini_batches, chunk = value("num_mini_batches"), value("local_rollout_forward_batch_size")
    for name, number in (("per_device_train_batch_size", per_device), ("gradient_accumulation_steps", accumulation),
                         ("num_mini_batches", mini_batches), ("local_rollout_forward_batch_size", chunk),
                         ("num_ppo_epochs", value("num_ppo_epochs"))):
        if number < 1:
            problems.append(f"`{name}` must be at least 1, got {number}")
            return
    local_batch = per_device * accumulation  # split into num_mini_batches, as in TRL 1.12
    if accumulation % mini_batches:
        problems.append(f"`num_mini_batches` ({mini_batches}) must divide `gradient_accumulation_steps` "
                        f"({accumulation}): each mini-batch is one optimizer step over whole micro-batches")
    if local_batch % min(chunk, local_batch):
        problems.append(f"`local_rollout_forward_batch_size` ({chunk}) must divide the rollouts per process "
                        f"(per_device_train_batch_size x gradient_accumulation_steps = {local_batch})")
    if value("stop_token") is not None and value("stop_token_id") is not None:
        problems.append(f"`stop_token` ({value('stop_token')}) and `stop_token_id` ({value('stop_token_id')}) are both "
                        "set; keep one")
    episodes = value("total_episodes")
    batch = local_batch * num_processes
    if episodes is not None and episodes < batch:
        problems.append(f"`total_episodes` ({episodes}) is less than one batch of rollouts ({local_batch} per process "
                        f"x {num_processes} processes = {batch})")

    policy = _local(value("model_name_or_path"))
    if policy is None:
        return
    tokenizer = _json(policy / "tokenizer_config.json")
    if tokenizer and not tokenizer.get("eos_token"):  # a missing pad token is added when the ranks load it
        problems.append(f"`model_name_or_path`: the tokenizer in {policy} has no eos_token; PPO needs one")
    vocab_size = _json(policy / "config.json").get("vocab_size")
    stop = value("stop_token_id")
    if stop is not None and vocab_size is not None and not 0 <= stop < vocab_size:
        problems.append(f"`stop_token_id` {stop} is not in the vocabulary of {policy} (0..{vocab_size - 1})")
