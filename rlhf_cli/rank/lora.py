"""LoRA inside the ranks: the adapter config from the recipe's TRL `ModelConfig` keys, PPO's adapters, and the
merged model written beside the adapter at the end of a run.

TRL's trainers (RLOO, GRPO, online DPO) take the config as `peft_config` and wrap the policy themselves; they use
the policy with its adapters disabled as the reference, so no reference model is loaded. PPO is ours: `adapt`
wraps its policy and value model the same way.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rlhf_cli.architectures import peft_targets
from rlhf_cli.rank.inputs import RankInputs


def peft_config(inputs: RankInputs, task_type: str | None = None) -> Any:
    """TRL's `get_peft_config` of the recipe's ModelConfig keys (a LoraConfig), or None without `use_peft`."""
    from trl import ModelConfig, get_peft_config

    names = {field.name for field in dataclasses.fields(ModelConfig)}
    model_args = ModelConfig(**{name: value for name, value in inputs.model.items() if name in names})
    if not model_args.use_peft:
        return None
    model_args.lora_target_modules = peft_targets(inputs.model.get("lora_target_modules"))
    if task_type is not None:
        model_args.lora_task_type = task_type
    return get_peft_config(model_args)
