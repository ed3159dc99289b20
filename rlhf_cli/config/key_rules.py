"""Checks that need a look at local model files, and the rules across keys of rlhf_cli/schema/ranges.yaml."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rlhf_cli.config.fields import Field, ranges
from rlhf_cli.config.paths import path_state
from rlhf_cli.models.hub import CONFIG_FILE, local_config, parse_config

# A decoder's sizes as config.json names them (GPT-2's names second); each must be a positive integer.
MODEL_SIZES = (("num_attention_heads", "n_head"), ("hidden_size", "n_embd"), ("num_hidden_layers", "n_layer"),
               ("vocab_size",))


def _local(path: Any) -> Path | None:
    return Path(path) if isinstance(path, str) and path_state(Path(path, CONFIG_FILE)).kind == "file" else None


def check_model_config(name: str, value: Any, where: str, problems: list[str]) -> None:
    """A local model's config.json is a JSON object whose sizes are positive (hub ids are checked when loaded)."""
    path = _local(value)
    if path is None:
        return
    config_file = path / CONFIG_FILE
    try:
        config = parse_config(config_file)
    except (OSError, ValueError) as error:
        problems.append(f"{where}: `{name}`: {config_file} is not valid JSON ({error}); save the model again")
        return
    if not isinstance(config, dict):
        problems.append(f"{where}: `{name}`: {config_file} is not a JSON object; save the model again")
        return
    for names in MODEL_SIZES:
        key = next((key for key in names if key in config), None)
        size = config.get(key) if key else None
        if key is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 1):
            problems.append(f"{where}: `{name}`: {config_file} has {key} {size!r}; a model's sizes are positive "
                            "integers: save the model again")


# Sequence classifiers, and causal LMs (GPT-2's is named GPT2LMHeadModel) loaded as one with a new score head.
SCORABLE_ARCHITECTURES = ("ForSequenceClassification", "ForCausalLM", "LMHeadModel")


def check_reward_model(value: Any, problems: list[str]) -> None:
    """A local reward model must be a sequence classifier, or a causal LM that the ranks load as one with a new
    score head (as the seed's pythia-70m); hub ids are loaded the same way."""
    path = _local(value)
    architectures = (local_config(path).get("architectures") or []) if path else []
    if architectures and not any(a.endswith(SCORABLE_ARCHITECTURES) for a in architectures):
        problems.append(f"`reward_model_name_or_path`: {path} is a {architectures[0]}, neither a sequence classifier "
                        "nor a causal LM (save it with AutoModelForSequenceClassification, num_labels=1)")


def _matches(wanted: Any, value: Any) -> bool:
    if isinstance(wanted, Mapping) and "not" in wanted:
        return value != wanted["not"]
    return value == wanted


def cross_field_problems(values: Callable[[str], Any], fields: Mapping[str, Field]) -> list[str]:
    """Each rule of ranges.yaml's `cross_field` whose keys all hold its values (rules on keys this algorithm
    lacks do not apply)."""
    return [rule["problem"] for rule in ranges()["cross_field"]
            if all(key in fields for key in rule["when"])
            and all(_matches(wanted, values(key)) for key, wanted in rule["when"].items())]
