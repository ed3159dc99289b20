"""What PPO writes and reads back: the policy as `from_pretrained` loads it (or only its adapters), and in a
checkpoint without DeepSpeed the trained weights of the policy and the value model, which resume restores.

Under ZeRO-3 the policy is consolidated from the shards on rank 0 by DeepSpeed itself, whatever the accelerate
config's `zero3_save_16bit_model` says (accelerate refuses without it); under LoRA only the trainable parameters
are gathered, plus the embedding and output layer when they were resized for an added pad token (PEFT saves them
in the adapter, and the base's own ones would not fit the tokenizer).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from rlhf_cli import compat
from rlhf_cli.output.run_dir import POLICY_AND_VALUE

POLICY_PREFIX = "policy."


def is_zero3(accelerator: Any) -> bool:
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    return plugin is not None and plugin.zero_stage == 3


def resized_embedding_names(policy_and_value: nn.Module) -> list[str]:
    """The state-dict names of the policy's input and output embedding weights when the policy is a PEFT model
    whose vocabulary differs from its base's (a pad token added); else none."""
    from rlhf_cli.rank.lora import embedding_resized

    policy = policy_and_value.policy
    if not embedding_resized(policy):
        return []
    wanted = {id(layer.weight) for layer in (policy.get_input_embeddings(), policy.get_output_embeddings())
              if layer is not None and hasattr(layer, "weight")}
    return [name for name, parameter in policy_and_value.named_parameters(remove_duplicate=False)
            if id(parameter) in wanted]


def _gathered(policy_and_value: nn.Module, names: list[str], is_main: bool) -> dict[str, torch.Tensor]:
    """The named ZeRO-3 parameters whole, on rank 0 (every rank must call it)."""
    import deepspeed

    parameters = dict(policy_and_value.named_parameters(remove_duplicate=False))
    unique = list({id(parameters[name]): parameters[name] for name in names}.values())
    with deepspeed.zero.GatheredParameters(unique, modifier_rank=None):
        return {name: parameters[name].detach().cpu().clone() for name in names} if is_main else {}


def policy_state(trainer: Any) -> dict[str, torch.Tensor] | None:
    """The policy's state dict for save_pretrained, on the main process (None elsewhere); every rank calls it."""
    accelerator, policy_and_value = trainer.accelerator, trainer.policy_and_value
    lora = _is_peft(policy_and_value.policy)
    if is_zero3(accelerator):
        state = compat.zero3_consolidated_state(trainer.model_wrapped, exclude_frozen=lora)
        if lora:
            extra = _gathered(policy_and_value, resized_embedding_names(policy_and_value),
                              accelerator.is_main_process)
            state = None if state is None else {**state, **extra}
    else:
        state = accelerator.get_state_dict(trainer.model_wrapped)
    if not accelerator.is_main_process or state is None:
        return None
    return {key.removeprefix(POLICY_PREFIX): value for key, value in state.items() if key.startswith(POLICY_PREFIX)}


def _is_peft(model: nn.Module) -> bool:
    from peft import PeftModel

    return isinstance(model, PeftModel)


def trained_state(policy_and_value: nn.Module) -> dict[str, torch.Tensor]:
    """What training changes: every trainable parameter of the policy and value model (under LoRA the adapters and
    the value head; the frozen weights come back from the base)."""
    return {name: parameter.detach().cpu() for name, parameter in policy_and_value.named_parameters()
            if parameter.requires_grad}


def save_trained_state(policy_and_value: nn.Module, checkpoint: str) -> None:
    torch.save(trained_state(policy_and_value), Path(checkpoint) / POLICY_AND_VALUE)


def load_trained_state(policy_and_value: nn.Module, checkpoint: str) -> None:
    """Put a checkpoint's trained weights back (resume without DeepSpeed, where transformers would load only the
    policy it finds as a model file, and not the value model)."""
    path = Path(checkpoint) / POLICY_AND_VALUE
    if not path.is_file():
        raise ValueError(f"{checkpoint} has no {POLICY_AND_VALUE}: it was not written by a PPO run without DeepSpeed, "
                         "so it cannot be resumed without DeepSpeed")
    saved = torch.load(path, map_location="cpu", weights_only=True)
    expected = set(trained_state(policy_and_value))
    if set(saved) != expected:
        missing, unexpected = sorted(expected - set(saved)), sorted(set(saved) - expected)
        raise ValueError(f"{path} does not fit this run's models (missing {missing[:3]}, unexpected "
                         f"{unexpected[:3]}): resume with the models and LoRA settings it was trained with")
    policy_and_value.load_state_dict(saved, strict=False)
