"""A commented starter recipe per algorithm: the fields a user is likely to touch, one comment each."""

from __future__ import annotations

from typing import Any

import yaml

from rlhf_cli.algorithms import algorithm
from rlhf_cli.algorithms.spec import FIELD_DEFAULT, StarterEntry
from rlhf_cli.config.fields import catalogue

Section = tuple[str, tuple[StarterEntry, ...]]


def _what(name: str) -> Section:
    return "What to train", (
        StarterEntry("model_name_or_path", "the policy: hub id, or a directory relative to this file",
                     "Qwen/Qwen2-0.5B-Instruct"),
        StarterEntry("dtype", "bfloat16, float16, float32 or auto", "bfloat16"),
        StarterEntry("reward_model_name_or_path", "a sequence classifier (num_labels=1) with the policy's tokenizer",
                     "trl-lib/Qwen2-0.5B-Reward"),
        StarterEntry("reward_funcs", "and/or Python: file.py:function, package.module:function",
                     ["rewards.py:my_reward"], enabled=False),
        *algorithm(name).starter_models,
        StarterEntry("dataset_name", "hub id, or a .json/.jsonl/.parquet/.csv file", "trl-lib/ultrafeedback-prompt"),
        StarterEntry("dataset_train_split", "the split to train on"),
        StarterEntry("dataset_prompt_column", "plain text or a list of chat messages"),
        StarterEntry("use_peft", "LoRA (--lora): adapters train, the base is frozen", True, enabled=False),
        StarterEntry("lora_r", "LoRA rank; TRL's lora_* keys set the rest", enabled=False),
    )


LAUNCH: Section = ("How to run it (flags override these)", (
    StarterEntry("num_processes", "processes (GPUs) in total, over all machines", 8),
    StarterEntry("gather", "true: gather to generate (fast); false: generate from shards (fits); auto: plan picks",
                 True),
    StarterEntry("gather_budget", "instead of gather: gather this share (or 2GiB) of the policy, the rest from "
                 "shards", 0.5, enabled=False),
    StarterEntry("offload_optimizer", "none, cpu or nvme: where ZeRO-3 keeps optimizer states", "cpu"),
    StarterEntry("offload_params", "none, cpu or nvme: where ZeRO-3 keeps parameter shards", "none"),
    StarterEntry("nvme_path", "a local NVMe directory, needed with nvme offload", "/local_nvme", enabled=False),
    StarterEntry("stall_timeout", "seconds no rank may go without progress before the job stops, naming who", 120,
                 enabled=False),
))


def _output(name: str) -> Section:
    return "Where the run goes", (
        StarterEntry("output_dir", "model, checkpoints, metrics; relative to where you run rlhf",
                     f"runs/{algorithm(name).command}"),
        StarterEntry("logging_steps", "log metrics every N steps (`rlhf report` plots them)", 1),
        StarterEntry("save_strategy", "no, steps or epoch: when to write checkpoints", "steps"),
        StarterEntry("save_steps", "steps between checkpoints", 100),
        StarterEntry("save_total_limit", "checkpoints kept (older ones are deleted)", 2),
        StarterEntry("report_to", "none, wandb, tensorboard, trackio, ... (a list for several)", "none"),
        StarterEntry("seed", "random seed"),
    )


def sections(name: str) -> tuple[Section, ...]:
    return (_what(name), LAUNCH, ("Training", algorithm(name).starter), _output(name))


def entry_value(name: str, entry: StarterEntry) -> Any:
    return catalogue(name)[entry.key].default if entry.value is FIELD_DEFAULT else entry.value


def _yaml_scalar(value: Any) -> str:
    """One value as YAML flow text, quoted where YAML would misread it (`no`, `1e-6`)."""
    return yaml.safe_dump([value], default_flow_style=True, width=10**6).strip()[1:-1]


def starter_recipe(algorithm_or_command: str, file_name: str = "FILE") -> str:
    """The recipe text; `file_name` is where it will be written, for the commands in its header."""
    entry = algorithm(algorithm_or_command)
    name, command = entry.name, entry.command
    lines = [f"# Starter recipe for `rlhf {command}`. Edit the models and data, then check and run it:",
             f"#   rlhf {command} -r {file_name} --dry-run",
             f"#   rlhf {command} -r {file_name}",
             f"# Any other field of {entry.config_name} may be added at the top level.",
             "# Flags and --set override what is written here."]
    rows = [(section, [((("" if line.enabled else "# ") + f"{line.key}: "
                         + _yaml_scalar(entry_value(name, line))), line.comment) for line in entries])
            for section, entries in sections(name)]
    for section, pairs in rows:
        width = max(len(text) for text, _ in pairs) + 2
        lines += ["", f"# {section}"]
        lines += [f"{text.ljust(width)}# {comment}" for text, comment in pairs]
    return "\n".join(lines) + "\n"
