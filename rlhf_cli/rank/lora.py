"""LoRA inside the ranks: the adapter config from the recipe's TRL `ModelConfig` keys, PPO's adapters, and the
merged model written beside the adapter at the end of a run.

TRL's trainers (RLOO, GRPO, online DPO) take the config as `peft_config` and wrap the policy themselves; they use
the policy with its adapters disabled as the reference, so no reference model is loaded. PPO is ours:
`adapt_ppo_models` wraps its policy and value model, and the trainer disables the adapters for the reference.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

from rlhf_cli.models.architectures import peft_targets
from rlhf_cli.output.run_dir import RunDir
from rlhf_cli.rank.inputs import RankInputs

SEQUENCE_CLASSIFIER = "SEQ_CLS"  # PEFT's task type that trains a classifier's score head whole


def peft_config(inputs: RankInputs, task_type: str | None = None) -> Any:
    """TRL's `get_peft_config` of the recipe's ModelConfig keys (a LoraConfig), or None without `use_peft`."""
    from trl import ModelConfig, get_peft_config

    names = {field.name for field in dataclasses.fields(ModelConfig)}
    # Copies: PEFT extends a config's modules_to_save in place (the SEQ_CLS value model adds its score head),
    # which must reach neither the recipe's list nor the policy's config.
    model_args = ModelConfig(**{name: copy.deepcopy(value) for name, value in inputs.model.items() if name in names})
    if not model_args.use_peft:
        return None
    model_args.lora_target_modules = peft_targets(inputs.model.get("lora_target_modules"))
    if task_type is not None:
        model_args.lora_task_type = task_type
    return get_peft_config(model_args)


def adapt_ppo_models(policy: Any, value_model: Any, inputs: RankInputs) -> tuple[Any, Any]:
    """PPO's policy and value model with adapters, when the recipe asks for LoRA.

    The value model gets adapters too, with its score head trained whole (PEFT's SEQ_CLS task keeps it in
    modules_to_save): it starts from the reward model, often as large as the policy, and trained fully its Adam
    states would cost what LoRA saves on the policy. Under ZeRO-3 the adapters keep the model's dtype, as in
    TRL's trainers: fp32 adapters beside 16-bit frozen weights mix dtypes in ZeRO-3's gathers (trl#6091).
    """
    config = peft_config(inputs)
    if config is None:
        return policy, value_model
    from peft import get_peft_model
    from transformers.integrations import is_deepspeed_zero3_enabled

    keep_dtype = {"autocast_adapter_dtype": False} if is_deepspeed_zero3_enabled() else {}
    return (get_peft_model(policy, config, **keep_dtype),
            get_peft_model(value_model, peft_config(inputs, task_type=SEQUENCE_CLASSIFIER), **keep_dtype))


def embedding_resized(policy: Any) -> bool:
    """Whether a PEFT policy's vocabulary differs from its base checkpoint's (a pad token was added): PEFT then saves
    the embedding and output layer in the adapter, and loading it needs the base resized first (`load_base`)."""
    from peft import PeftModel
    from transformers import AutoConfig

    if not isinstance(policy, PeftModel):
        return False
    base = policy.peft_config[policy.active_adapter].base_model_name_or_path
    return AutoConfig.from_pretrained(base).vocab_size != policy.config.vocab_size


def load_base(path: str, tokenizer: Any, **init_kwargs: Any) -> Any:
    """The base causal LM an adapter was trained on, its embedding resized to `tokenizer` (which has the pad token
    the run added) so that an adapter holding the resized embedding loads on it."""
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(path, **init_kwargs)
    if len(tokenizer) > base.get_input_embeddings().num_embeddings:
        base.resize_token_embeddings(len(tokenizer), mean_resizing=False)  # the adapter's own rows replace these
    return base


def save_merged_model(inputs: RankInputs, output_dir: Path) -> Path | None:
    """With `merge_adapter`: the policy with the adapter just saved in `output_dir` merged in, written where
    `from_pretrained` loads it (RunDir.merged_model). Call on one rank, once training is over: it loads the base
    model whole into CPU memory, outside ZeRO-3, and merges with PEFT's merge_and_unload."""
    if not (inputs.model_value("use_peft") and inputs.model_value("merge_adapter")):
        return None
    from peft import PeftModel
    from transformers import AutoTokenizer
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    unset_hf_deepspeed_config()  # else from_pretrained would partition the base across ranks that are not loading
    init_kwargs = {name: value for name, value in inputs.model_init_kwargs().items() if value is not None}
    tokenizer = AutoTokenizer.from_pretrained(output_dir, trust_remote_code=init_kwargs.get("trust_remote_code", False))
    base = load_base(inputs.model_value("model_name_or_path"), tokenizer, **init_kwargs)
    merged = PeftModel.from_pretrained(base, output_dir).merge_and_unload()
    target = RunDir(output_dir).merged_model
    merged.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target
