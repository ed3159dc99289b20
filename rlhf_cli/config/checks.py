"""Checks that need a look at local model files; no model is loaded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


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
