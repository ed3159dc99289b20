"""The models the ranks load as sequence classifiers: the reward model, and where the algorithm has one, the value
model (which starts from the reward model, else the policy). transformers must have a sequence-classification
class for the family (Granite, for one, has none), or every rank dies loading it after DeepSpeed has started.
Checked in the pre-launch process against transformers' public MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING, the
table AutoModelForSequenceClassification itself looks the config's class up in: no weights read."""

from __future__ import annotations

from typing import Any

from rlhf_cli.config.fields import catalogue
from rlhf_cli.rank.inputs import RankInputs

REWARD_KEY, VALUE_KEY, POLICY_KEY = "reward_model_name_or_path", "value_model_name_or_path", "model_name_or_path"


def classifier_paths(inputs: RankInputs) -> dict[str, str]:
    """{the key that names it: path} for each model the ranks load with AutoModelForSequenceClassification."""
    fields = catalogue(inputs.algorithm)
    reward = inputs.value(REWARD_KEY) if REWARD_KEY in fields else None
    paths = {REWARD_KEY: reward} if reward else {}
    if VALUE_KEY in fields:
        value = inputs.value(VALUE_KEY)
        if value or not reward:
            paths[VALUE_KEY] = value or inputs.value(POLICY_KEY)
    return paths


def classifier_problems(inputs: RankInputs) -> list[str]:
    """A model whose family transformers cannot load as a sequence classifier, in one line each. A model this
    process cannot read offline (a hub id not in the cache) or one with remote code is left to the ranks."""
    if inputs.value("trust_remote_code"):
        return []
    problems = []
    for key, path in classifier_paths(inputs).items():
        if (model_type := _unscorable_family(path, inputs.value("model_revision"))) is not None:
            from_policy = key == VALUE_KEY and not inputs.value(VALUE_KEY)
            named = f"{path} (the policy: PPO's value model starts from it)" if from_policy else path
            problems.append(f"`{key}`: {named} is a {model_type} model, and transformers has no "
                            f"sequence-classification class for {model_type}: the ranks load it with "
                            "AutoModelForSequenceClassification; name a reward or value model of a family that has "
                            "one, or score with `reward_funcs`")
    return problems


def _unscorable_family(path: str, revision: Any) -> str | None:
    """The model type at `path` when transformers has no sequence classifier for it; None when it has, or when
    the config cannot be read here."""
    from transformers import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING, AutoConfig

    try:
        config = AutoConfig.from_pretrained(path, revision=revision, local_files_only=True)
    except (OSError, ValueError):
        return None  # not readable offline, or a family this transformers does not know: the resolver's concern
    return None if type(config) in MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING else config.model_type
