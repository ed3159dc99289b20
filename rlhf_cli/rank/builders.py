"""One builder per algorithm: resolved recipe -> a ready TRL trainer. A closed registry."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlhf_cli.rank.inputs import RankInputs, load_prompts, reward_funcs
from rlhf_cli.rank.zero3 import apply_zero3_settings


def _config(config_class: type, inputs: RankInputs, **extra: Any) -> Any:
    """TRL's config with the recipe's trainer keys; ZeRO-3 knobs applied to its DeepSpeed plugin."""
    values = dict(inputs.trainer)
    values["model_init_kwargs"] = {**inputs.model_init_kwargs(), **extra}
    config = config_class(**values)
    apply_zero3_settings(config, inputs.zero3)
    return config


def build_rloo(inputs: RankInputs) -> Any:
    from trl import RLOOConfig, RLOOTrainer

    config = _config(RLOOConfig, inputs)
    train, evaluation = load_prompts(inputs)
    return RLOOTrainer(model=inputs.model_value("model_name_or_path"), reward_funcs=reward_funcs(inputs),
                       args=config, train_dataset=train, eval_dataset=evaluation)


def build_online_dpo(inputs: RankInputs) -> Any:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.experimental.online_dpo import OnlineDPOConfig, OnlineDPOTrainer

    # The trainer loads the policy with device_map="auto" unless told otherwise, which ZeRO-3 refuses.
    config = _config(OnlineDPOConfig, inputs, device_map=None)
    model_path = inputs.model_value("model_name_or_path")
    init_kwargs = {k: v for k, v in config.model_init_kwargs.items() if v is not None}
    # Under ZeRO-3 the trainer cannot copy a sharded policy into a reference model: load one, after the
    # config exists, so that it is partitioned at load time like the policy.
    reference = AutoModelForCausalLM.from_pretrained(model_path, **init_kwargs)
    train, evaluation = load_prompts(inputs)
    tokenizer = AutoTokenizer.from_pretrained(model_path, revision=init_kwargs.get("revision"))
    return OnlineDPOTrainer(model=model_path, ref_model=reference, reward_funcs=reward_funcs(inputs), args=config,
                            train_dataset=train, eval_dataset=evaluation, processing_class=tokenizer)


BUILDERS: dict[str, Callable[[RankInputs], Any]] = {"rloo": build_rloo, "online_dpo": build_online_dpo}
