"""A commented starter recipe per algorithm: the fields a user is likely to touch, one comment each."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from rlhf_cli.config.fields import catalogue

TRL_DEFAULT = object()  # take the value from the field's default in the catalogue


@dataclass(frozen=True)
class Entry:
    key: str
    comment: str
    value: Any = TRL_DEFAULT
    enabled: bool = True  # False: written commented out, for keys most runs leave unset


Section = tuple[str, tuple[Entry, ...]]

TRAINER_CONFIG = {"ppo": "rlhf's PPO (named as in TRL's former PPOConfig)", "rloo": "trl.RLOOConfig",
                  "online_dpo": "trl.experimental.online_dpo.OnlineDPOConfig"}


def _what(algorithm: str) -> Section:
    entries = [
        Entry("model_name_or_path", "the policy: hub id, or a directory relative to this file",
              "Qwen/Qwen2-0.5B-Instruct"),
        Entry("dtype", "bfloat16, float16, float32 or auto", "bfloat16"),
        Entry("reward_model_name_or_path", "a sequence classifier with the policy's tokenizer" if algorithm == "ppo"
              else "a sequence classifier (num_labels=1)", "trl-lib/Qwen2-0.5B-Reward"),
        Entry("reward_funcs", "and/or Python: file.py:function, package.module:function",
              ["rewards.py:my_reward"], enabled=False),
    ]
    if algorithm == "ppo":
        entries.append(Entry("value_model_name_or_path", "the value model's start; default: the reward model",
                             "./my-value-model", enabled=False))
    entries += [
        Entry("dataset_name", "hub id, or a .json/.jsonl/.parquet/.csv file", "trl-lib/ultrafeedback-prompt"),
        Entry("dataset_train_split", "the split to train on"),
        Entry("dataset_prompt_column", "plain text or a list of chat messages"),
    ]
    return "What to train", tuple(entries)


LAUNCH: Section = ("How to run it (flags override these)", (
    Entry("num_processes", "processes (GPUs) in total, over all machines", 8),
    Entry("gather", "true: gather to generate (fast); false: generate from shards (fits); auto: plan picks", True),
    Entry("offload_optimizer", "none, cpu or nvme: where ZeRO-3 keeps optimizer states", "cpu"),
    Entry("offload_params", "none, cpu or nvme: where ZeRO-3 keeps parameter shards", "none"),
    Entry("nvme_path", "a local NVMe directory, needed with nvme offload", "/local_nvme", enabled=False),
))

TRAINING: dict[str, tuple[Entry, ...]] = {
    "ppo": (
        Entry("total_episodes", "responses to train on in total", 10000),
        Entry("response_length", "most tokens generated per response", 256),
        Entry("stop_token", "eos: cut responses after the first EOS token", "eos"),
        Entry("missing_eos_penalty", "subtracted from the score of unfinished responses", 1.0),
        Entry("per_device_train_batch_size", "rollouts per GPU per micro-batch", 4),
        Entry("gradient_accumulation_steps", "micro-batches per update: rollouts per GPU = this x the above", 4),
        Entry("num_mini_batches", "optimizer steps per pass over the rollouts; divides the above", 1),
        Entry("local_rollout_forward_batch_size", "sequences per generation pass; divides rollouts per GPU",
              16),
        Entry("num_ppo_epochs", "passes over each batch of rollouts"),
        Entry("learning_rate", "AdamW learning rate"),
        Entry("kl_coef", "weight of the per-token KL penalty (vs. the reference)"),
        Entry("kl_estimator", "k1 (log-ratio) or k3 (unbiased, non-negative)"),
        Entry("cliprange", "clip range of the policy ratio"),
        Entry("vf_coef", "weight of the value loss"),
        Entry("temperature", "sampling temperature of rollouts"),
    ),
    "rloo": (
        Entry("max_steps", "optimizer steps in total", 1000),
        Entry("num_generations", "completions per prompt, at least 2 (leave-one-out baseline)", 4),
        Entry("max_completion_length", "most tokens generated per completion", 256),
        Entry("per_device_train_batch_size", "completions per GPU per micro-batch", 4),
        Entry("gradient_accumulation_steps", "micro-batches per optimizer step", 4),
        Entry("learning_rate", "AdamW learning rate"),
        Entry("beta", "weight of the KL penalty against the reference model"),
        Entry("temperature", "sampling temperature"),
        Entry("gradient_checkpointing", "recompute activations: less memory, slower", True),
    ),
    "online_dpo": (
        Entry("max_steps", "optimizer steps in total", 1000),
        Entry("max_new_tokens", "most tokens generated per completion", 256),
        Entry("max_length", "most tokens of prompt + completion scored", 1024),
        Entry("missing_eos_penalty", "subtracted from the score of unfinished completions", 1.0),
        Entry("per_device_train_batch_size", "prompts per GPU per micro-batch (two completions each)", 2),
        Entry("gradient_accumulation_steps", "micro-batches per optimizer step", 8),
        Entry("learning_rate", "AdamW learning rate"),
        Entry("beta", "pull toward the reference model (a list: one per epoch)"),
        Entry("temperature", "sampling temperature"),
        Entry("gradient_checkpointing", "recompute activations: less memory, slower", True),
    ),
}


def _output(algorithm: str) -> Section:
    return "Where the run goes", (
        Entry("output_dir", "model, checkpoints, metrics; relative to where you run rlhf",
              f"runs/{algorithm.replace('_', '-')}"),
        Entry("logging_steps", "log metrics every N steps (`rlhf report` plots them)", 1),
        Entry("save_strategy", "no, steps or epoch: when to write checkpoints", "steps"),
        Entry("save_steps", "steps between checkpoints", 100),
        Entry("save_total_limit", "checkpoints kept (older ones are deleted)", 2),
        Entry("report_to", "none, wandb, tensorboard, trackio, ... (a list for several)", "none"),
        Entry("seed", "random seed"),
    )


def sections(algorithm: str) -> tuple[Section, ...]:
    return (_what(algorithm), LAUNCH, ("Training", TRAINING[algorithm]), _output(algorithm))


def entry_value(algorithm: str, entry: Entry) -> Any:
    return catalogue(algorithm)[entry.key].default if entry.value is TRL_DEFAULT else entry.value


def _yaml_scalar(value: Any) -> str:
    """One value as YAML flow text, quoted where YAML would misread it (`no`, `1e-6`)."""
    return yaml.safe_dump([value], default_flow_style=True, width=10**6).strip()[1:-1]


def starter_recipe(algorithm: str, file_name: str = "FILE") -> str:
    """The recipe text; `file_name` is where it will be written, for the commands in its header."""
    command = algorithm.replace("_", "-")
    lines = [f"# Starter recipe for `rlhf {command}`. Edit the models and data, then check and run it:",
             f"#   rlhf {command} -r {file_name} --dry-run",
             f"#   rlhf {command} -r {file_name}",
             f"# Any other field of {TRAINER_CONFIG[algorithm]} may be added at the top level.",
             "# Flags and --set override what is written here."]
    rows = [(section, [((("" if entry.enabled else "# ") + f"{entry.key}: "
                         + _yaml_scalar(entry_value(algorithm, entry))), entry.comment) for entry in entries])
            for section, entries in sections(algorithm)]
    for section, pairs in rows:
        width = max(len(text) for text, _ in pairs) + 2
        lines += ["", f"# {section}"]
        lines += [f"{text.ljust(width)}# {comment}" for text, comment in pairs]
    return "\n".join(lines) + "\n"
