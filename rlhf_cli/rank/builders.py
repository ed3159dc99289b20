"""One builder per algorithm: resolved recipe -> a ready trainer. The registry (rlhf_cli.algorithms) names them."""

from __future__ import annotations

from typing import Any

from rlhf_cli.algorithms import algorithm
from rlhf_cli.algorithms.spec import load_object
from rlhf_cli.generation.engines import SYNC_CHECK_KEY
from rlhf_cli.rank.engines import engine_room
from rlhf_cli.rank.inputs import RankInputs, agent_arguments, load_prompts, reward_funcs, reward_functions
from rlhf_cli.rank.lora import adapt_ppo_models, peft_config
from rlhf_cli.rank.zero3 import apply_zero3_settings


def _config(config_class: type, inputs: RankInputs, **extra: Any) -> Any:
    """TRL's config with the recipe's trainer keys; ZeRO-3 knobs applied to its DeepSpeed plugin.

    Seeds every RNG too: the builders load models before the trainer seeds anything, and a head that
    starts from random weights (PPO's value head on a policy checkpoint) must start the same every run.
    """
    from transformers import set_seed

    config = config_class(**inputs.config_values(**extra))
    apply_zero3_settings(config, inputs.zero3)
    set_seed(config.seed)
    if (room := engine_room(inputs.generation().engine.spec)) is not None:
        room.install(config, inputs)
    return config


def _note_causal_lm_reward(inputs: RankInputs) -> None:
    """TRL loads a reward model path as a sequence classifier: say when its score head starts untrained."""
    from rlhf_cli.rank.loading import note_untrained_head

    path = inputs.script_value("reward_model_name_or_path")
    if path:
        init_kwargs = inputs.model_init_kwargs()
        note_untrained_head(path, "reward model", init_kwargs.get("revision"),
                            bool(init_kwargs.get("trust_remote_code")))


def build_trl_generating(inputs: RankInputs) -> Any:
    """TRL's generating trainers that load the policy (and a reference, when beta is not 0) from its path (RLOO,
    GRPO): the registry entry's `config_class` and `trainer_class`; GRPO's also takes the recipe's tools,
    environments and rollout function."""
    entry = algorithm(inputs.algorithm)
    config = _config(load_object(entry.config_class), inputs)
    _note_causal_lm_reward(inputs)
    train, evaluation = load_prompts(inputs)
    trainer_class = load_object(entry.trainer_class)
    trainer = trainer_class(model=inputs.model_value("model_name_or_path"), reward_funcs=reward_funcs(inputs),
                            args=config, train_dataset=train, eval_dataset=evaluation,
                            peft_config=peft_config(inputs), **agent_arguments(inputs))
    if entry.takes_tools:
        from rlhf_cli.rank.agent_turns import take_turns_together

        take_turns_together(trainer)
    return trainer


def build_online_dpo(inputs: RankInputs) -> Any:
    from accelerate.utils import set_seed
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.experimental.online_dpo import OnlineDPOConfig, OnlineDPOTrainer

    # The trainer loads the policy with device_map="auto" unless told otherwise, which ZeRO-3 refuses.
    config = _config(OnlineDPOConfig, inputs, device_map=None)
    _note_causal_lm_reward(inputs)
    model_path = inputs.model_value("model_name_or_path")
    init_kwargs = {k: v for k, v in config.model_init_kwargs.items() if v is not None}
    # Under ZeRO-3 the trainer cannot copy a sharded policy into a reference model: load one, after the
    # config exists, so that it is partitioned at load time like the policy. With LoRA the reference is the
    # policy with its adapters disabled.
    lora = peft_config(inputs)
    reference = None if lora else AutoModelForCausalLM.from_pretrained(model_path, **init_kwargs)
    train, evaluation = load_prompts(inputs)
    tokenizer = AutoTokenizer.from_pretrained(model_path, revision=init_kwargs.get("revision"),
                                              trust_remote_code=config.trust_remote_code)
    trainer = OnlineDPOTrainer(model=model_path, ref_model=reference, reward_funcs=reward_funcs(inputs), args=config,
                               train_dataset=train, eval_dataset=evaluation, processing_class=tokenizer,
                               peft_config=lora)
    # TRL's OnlineDPOTrainer seeds every rank alike (RLOO and GRPO reseed per rank as the last step of __init__):
    # each rank samples its own random numbers, or ranks sample the same tokens on different prompts.
    set_seed(config.seed, device_specific=True)
    return trainer


def _tokenize_prompts(dataset: Any, tokenizer: Any) -> Any:
    """Prompt token ids; chat-formatted prompts go through the tokenizer's chat template (which writes any BOS
    itself), plain text gets the tokenizer's own special tokens (BOS for Llama 3, Mistral, Gemma)."""
    def encode(row: dict[str, Any]) -> dict[str, Any]:
        prompt = row["prompt"]
        if isinstance(prompt, list):
            return {"input_ids": tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True,
                                                               return_dict=False)}
        return {"input_ids": tokenizer(prompt).input_ids}

    return dataset.map(encode, remove_columns=dataset.column_names)


def build_ppo(inputs: RankInputs) -> Any:
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    from rlhf_cli.rank.loading import add_pad_token, fit_embeddings, note_untrained_head, say
    from rlhf_cli.rank.ppo.config import PPOConfig
    from rlhf_cli.rank.ppo.trainer import PPOTrainer

    config = _config(PPOConfig, inputs)
    init_kwargs = {k: v for k, v in config.model_init_kwargs.items() if v is not None}
    policy_path = inputs.model_value("model_name_or_path")
    reward_path = inputs.script_value("reward_model_name_or_path")
    # Loaded after the config exists, so that ZeRO-3 partitions each model as it loads.
    tokenizer = AutoTokenizer.from_pretrained(policy_path, padding_side="left", revision=init_kwargs.get("revision"),
                                              trust_remote_code=config.trust_remote_code)
    pad_added = add_pad_token(tokenizer)
    policy = AutoModelForCausalLM.from_pretrained(policy_path, **init_kwargs)
    # With LoRA the reference is the policy with its adapters disabled: no second copy.
    reference = None if inputs.model_value("use_peft") else AutoModelForCausalLM.from_pretrained(policy_path,
                                                                                               **init_kwargs)
    rows = policy.get_input_embeddings().num_embeddings
    for model in (policy, reference):
        if model is not None:
            fit_embeddings(model, tokenizer, config.seed)
    if (room := engine_room(inputs.generation().engine.spec)) is not None:
        room.refuse_resized_policy(policy_path, rows, policy.get_input_embeddings().num_embeddings)
    if pad_added:
        say(f"the tokenizer of {policy_path} has no pad token of its own: added {tokenizer.pad_token!r} "
            f"(id {tokenizer.pad_token_id})")
    _note_causal_lm_reward(inputs)
    reward = None
    if reward_path:
        reward = AutoModelForSequenceClassification.from_pretrained(reward_path, num_labels=1, **init_kwargs)
    value_path = config.value_model_name_or_path or reward_path or policy_path
    if config.value_model_name_or_path or reward_path:  # started from the policy, a new head is expected
        note_untrained_head(value_path, "value model", init_kwargs.get("revision"), config.trust_remote_code)
    value = AutoModelForSequenceClassification.from_pretrained(value_path, num_labels=1, **init_kwargs)
    policy, value = adapt_ppo_models(policy, value, inputs)
    train, _ = load_prompts(inputs)
    return PPOTrainer(args=config, processing_class=tokenizer, policy=policy, ref_policy=reference,
                      value_model=value, reward_model=reward, reward_funcs=reward_functions(inputs),
                      train_dataset=_tokenize_prompts(train, tokenizer),
                      generation=inputs.generation(),
                      sync_check_steps=inputs.launch_value(SYNC_CHECK_KEY),
                      sync_delta=inputs.launch_value("weight_sync_delta"))
