"""rlhf's PPO trainer in one process, without DeepSpeed, on the model-family stand-ins.

What real checkpoints expose and the smoke models hide: generation settings inherited from the
checkpoint, dropout, tokenizers without a pad token, causal-LM reward models; and the trainer's own
bookkeeping (seeds, gradient accumulation, mini-batches, logged numbers).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from helpers import PROMPTS, Recorder, build, logged, train


def chat_prompts(path: Path) -> Path:
    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines()]
    path.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": row["prompt"]}]}) + "\n"
                            for row in rows))
    return path


def with_generation_config(source: Path, target: Path, values: dict[str, Any] | None) -> Path:
    """A copy of the checkpoint `source` whose generation_config.json holds `values` (None: no such file)."""
    shutil.copytree(source, target)
    (target / "generation_config.json").unlink()
    if values is not None:
        (target / "generation_config.json").write_text(json.dumps(values))
    return target


def confident(source: Path, target: Path) -> Path:
    """`source` with logits scaled up 8 times: a peaked next-token distribution, as a trained model has,
    so that anything that reshapes it (a repetition penalty, top-k) changes what is sampled."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(source)
    model.get_decoder().norm.weight.data *= 8
    model.save_pretrained(target)
    AutoTokenizer.from_pretrained(source).save_pretrained(target)
    return target


def steps_counted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the optimizer steps actually taken (accelerate skips the inner step while accumulating)."""
    import torch

    taken: list[int] = []
    step = torch.optim.AdamW.step

    def counted(self, *args: Any, **kwargs: Any) -> Any:
        taken.append(1)
        return step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", counted)
    return taken


# -- 1. generation: fully specified, chunks padded to one length ----------------------------------------------

def test_rollouts_ignore_the_checkpoints_generation_config(family_models: dict[str, Path], tmp_path: Path) -> None:
    """Qwen2.5 ships a repetition penalty, top-k, top-p and two EOS ids. Rollouts must be samples of
    softmax(logits / temperature) alone, the distribution their old log-probs are computed from."""
    shipped = confident(family_models["qwen2.5"], tmp_path / "shipped")
    bare = with_generation_config(shipped, tmp_path / "bare", {})
    samples = {}
    for name, model in (("shipped", shipped), ("bare", bare)):
        recorder = Recorder()
        train(model, tmp_path / f"out-{name}", recorder=recorder, total_episodes=4)
        samples[name] = recorder.completion_ids
    assert samples["shipped"] == samples["bare"]


def test_generation_chunks_that_stop_early_are_padded_to_one_length(family_models: dict[str, Path], tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers stops a chunk once all its sequences emitted the stop token, so chunks differ in length."""
    recorder = Recorder()
    trainer = build(family_models["qwen2.5"], tmp_path / "out", recorder=recorder, stop_token="eos",
                    local_rollout_forward_batch_size=1, total_episodes=4)
    eos, pad, length = trainer.processing_class.eos_token_id, trainer.processing_class.pad_token_id, 6
    policy = trainer.policy_and_value.policy
    generate, calls = policy.generate, []

    def first_chunk_stops_after_two_tokens(*args: Any, **kwargs: Any) -> Any:
        out = generate(*args, **kwargs)
        calls.append(out)
        if len(calls) == 1:
            out = out[:, :out.size(1) - length + 2].clone()
            out[:, -1] = eos
        return out

    monkeypatch.setattr(policy, "generate", first_chunk_stops_after_two_tokens)
    trainer.train()
    first = recorder.completion_ids[0]
    # Reward functions get each completion's own tokens, as TRL's trainers pass them: no padding after its stop
    assert len(first) == 2 and first[1] == eos
    assert all(pad not in ids and len(ids) <= length for ids in recorder.completion_ids)
    assert any(len(ids) == length for ids in recorder.completion_ids)


# -- 2. dropout off ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", ["gpt2", "qwen2.5"])
def test_dropout_is_off_in_all_four_models(family: str, family_models: dict[str, Path], tmp_path: Path) -> None:
    """GPT-2 has dropout layers at 0.1; Llama-style attention reads its dropout from a float (here set to 0.1
    in a Qwen2.5 config). Off, the first (and only) micro-batch of an update sees the very log-probs its
    rollouts were generated with: ratio 1, approximate KL 0."""
    import torch

    model = tmp_path / family
    shutil.copytree(family_models[family], model)
    config = json.loads((model / "config.json").read_text())
    if family == "qwen2.5":
        (model / "config.json").write_text(json.dumps({**config, "attention_dropout": 0.1}))
    trainer = train(model, tmp_path / "out", reward=model, gradient_accumulation_steps=1,
                    per_device_train_batch_size=4, total_episodes=8)
    for entry in logged(trainer):
        assert entry["val/ratio"] == pytest.approx(1.0, abs=1e-6) and entry["policy/approxkl_avg"] < 1e-10
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    models = trainer.policy_and_value.policy, trainer.policy_and_value.value_model, trainer.ref_policy, \
        trainer.reward_model
    for model in models:
        model.train()
        first, second = model(input_ids=ids).logits, model(input_ids=ids).logits
        assert torch.equal(first, second), type(model).__name__


# -- 3. per-rank seeds -------------------------------------------------------------------------------------------

def test_each_rank_samples_with_its_own_seed(family_models: dict[str, Path], tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The same prompts on rank 0 and rank 1 (one process playing each): different random numbers, so
    different samples (with one seed for all ranks a random model's samples agreed on 91% of tokens)."""
    from accelerate import Accelerator

    samples = []
    for rank in (0, 1):
        monkeypatch.setattr(Accelerator, "process_index", property(lambda self, rank=rank: rank))
        recorder = Recorder()
        train(family_models["gemma"], tmp_path / f"rank-{rank}", recorder=recorder, total_episodes=4)
        samples.append([token for ids in recorder.completion_ids for token in ids])
    agree = sum(a == b for a, b in zip(*samples, strict=True)) / len(samples[0])
    assert agree < 0.5, agree


# -- 4. the loader's last batch --------------------------------------------------------------------------------

def test_the_last_prompt_batch_of_a_pass_accumulates_like_the_others(family_models: dict[str, Path], tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Four prompts, four rollouts per update: every batch is the last of its pass over the data. Each update
    is one optimizer step over 2 micro-batches, not one step per micro-batch."""
    prompts = tmp_path / "four.jsonl"
    prompts.write_text("".join(PROMPTS.read_text().splitlines(keepends=True)[:4]))
    taken = steps_counted(monkeypatch)
    trainer = train(family_models["gemma"], tmp_path / "out", prompts=prompts, total_episodes=12)
    assert trainer.state.global_step == 3 and len(taken) == 3


# -- 5. a reward function returning None ---------------------------------------------------------------------------

def test_a_reward_function_returning_none_stops_naming_it_and_the_sample(family_models: dict[str, Path],
                                                                           tmp_path: Path) -> None:
    recorder = Recorder(lambda count: [0.5, None] + [0.5] * (count - 2))
    with pytest.raises(ValueError, match=r"reward function `recorder` returned None for sample 1 of 4 \(prompt '"):
        train(family_models["gemma"], tmp_path / "out", recorder=recorder, total_episodes=4)


# -- 6. num_mini_batches as in TRL 1.12 ---------------------------------------------------------------------------

def test_a_mini_batch_smaller_than_a_micro_batch_is_one_micro_batch(family_models: dict[str, Path], tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """TRL 1.12's own settings shape (8 x 1 rollouts per process, 2 mini-batches), here 4 x 1: num_mini_batches
    divides the rollouts, not gradient_accumulation_steps; each mini-batch of 2 is one step (once refused)."""
    taken = steps_counted(monkeypatch)
    trainer = train(family_models["gemma"], tmp_path / "out", per_device_train_batch_size=4,
                    gradient_accumulation_steps=1, num_mini_batches=2, num_ppo_epochs=2, total_episodes=8)
    assert [entry["episode"] for entry in logged(trainer)] == [4, 8]
    assert len(taken) == 2 * 2 * 2  # updates x epochs x mini-batches
    assert trainer.micro_batch_size == 2 and trainer.micro_batches_per_step == 1


def test_num_mini_batches_splits_the_rollouts_of_a_process(family_models: dict[str, Path], tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Rollouts per process = per_device_train_batch_size x gradient_accumulation_steps (1 x 4), split into
    num_mini_batches (2) of 2 micro-batches each, one optimizer step per mini-batch."""
    taken = steps_counted(monkeypatch)
    trainer = train(family_models["gemma"], tmp_path / "out", per_device_train_batch_size=1,
                    gradient_accumulation_steps=4, num_mini_batches=2, num_ppo_epochs=2, total_episodes=8)
    assert [entry["episode"] for entry in logged(trainer)] == [4, 8]
    assert len(taken) == 2 * 2 * 2  # updates x epochs x mini-batches


# -- 7. gradient checkpointing ---------------------------------------------------------------------------------

def test_gradient_checkpointing_trains_with_it_and_generates_without(family_models: dict[str, Path], tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Checkpointing for the policy and value model in training; generation in eval mode, where transformers
    keeps the KV cache (in train mode with checkpointing it turns the cache off)."""
    trainer = build(family_models["gemma"], tmp_path / "out", gradient_checkpointing=True, total_episodes=8)
    policy, value = trainer.policy_and_value.policy, trainer.policy_and_value.value_model
    generate, training = policy.generate, []

    def recording_mode(*args: Any, **kwargs: Any) -> Any:
        training.append(policy.training)
        return generate(*args, **kwargs)

    monkeypatch.setattr(policy, "generate", recording_mode)
    trainer.train()
    assert policy.is_gradient_checkpointing and value.is_gradient_checkpointing
    assert training == [False, False]


# -- 8. tokenizers without a pad token -------------------------------------------------------------------------

@pytest.mark.parametrize("family", ["pythia", "gpt2", "llama3", "mistral"])
def test_a_tokenizer_without_pad_gets_one(family: str, family_models: dict[str, Path], tmp_path: Path) -> None:
    """A new pad token, distinct from EOS; the embedding grows only when it has no spare row (pythia has), the
    same new row in the policy and its reference (the first update's KL is 0)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    source = family_models[family]
    trainer = train(source, tmp_path / "out", stop_token="eos", missing_eos_penalty=1.0)
    tokenizer = trainer.processing_class
    assert tokenizer.pad_token_id is not None and tokenizer.pad_token_id != tokenizer.eos_token_id
    rows = AutoConfig.from_pretrained(source).vocab_size
    expected_rows = rows if family == "pythia" else len(tokenizer)
    for model in (trainer.policy_and_value.policy, trainer.ref_policy):
        assert model.get_input_embeddings().num_embeddings == model.config.vocab_size == expected_rows
    assert logged(trainer)[0]["objective/kl"] == 0
    trainer.save_model()
    saved, saved_tokenizer = AutoModelForCausalLM.from_pretrained(tmp_path / "out"), \
        AutoTokenizer.from_pretrained(tmp_path / "out")
    assert saved_tokenizer.pad_token == tokenizer.pad_token and saved.config.vocab_size == expected_rows


def test_a_pad_token_equal_to_eos_is_replaced(family_models: dict[str, Path], tmp_path: Path) -> None:
    """pad == EOS would count every response's EOS as padding: responses would end before it, be scored
    before it, and always look unfinished to missing_eos_penalty."""
    model = tmp_path / "gemma"
    shutil.copytree(family_models["gemma"], model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**config, "pad_token": config["eos_token"]}))
    trainer = train(model, tmp_path / "out", stop_token="eos", total_episodes=4)
    assert trainer.processing_class.pad_token_id != trainer.processing_class.eos_token_id


# -- 9. a causal LM as reward model ------------------------------------------------------------------------------

def test_a_causal_lm_reward_model_gets_a_new_score_head_and_a_warning(family_models: dict[str, Path], tmp_path: Path,
                                                                      capfd: pytest.CaptureFixture[str]) -> None:
    """The seed's reward model, pythia-70m, is a GPTNeoXForCausalLM: loaded as a sequence classifier."""
    pythia = family_models["pythia"]
    trainer = train(pythia, tmp_path / "out", reward=pythia, total_episodes=4)
    assert type(trainer.reward_model).__name__ == type(trainer.policy_and_value.value_model).__name__ \
        == "GPTNeoXForSequenceClassification"
    warnings = [line for line in capfd.readouterr().err.splitlines() if "untrained" in line]
    assert len(warnings) == 2, warnings  # the reward model, and the value model started from it
    assert all("GPTNeoXForCausalLM" in line and str(pythia) in line for line in warnings)


# -- 10. smaller ------------------------------------------------------------------------------------------------

def test_stop_token_and_stop_token_id_together_are_refused(family_models: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"`stop_token` \(eos\) and `stop_token_id` \(1\) are both set"):
        build(family_models["gemma"], tmp_path / "out", stop_token="eos", stop_token_id=1)


def test_the_logged_learning_rate_is_the_one_the_update_used(family_models: dict[str, Path], tmp_path: Path) -> None:
    trainer = train(family_models["gemma"], tmp_path / "out", lr_scheduler_type="linear", total_episodes=8)
    assert [entry["lr"] for entry in logged(trainer)] == pytest.approx([1e-3, 5e-4])


def test_ratio_variance_is_logged(family_models: dict[str, Path], tmp_path: Path) -> None:
    """Over micro-batches: within the first epoch nothing has been updated yet (ratio 1 everywhere, variance 0);
    a second epoch sees the update."""
    once = logged(train(family_models["gemma"], tmp_path / "once", total_episodes=4))
    twice = logged(train(family_models["gemma"], tmp_path / "twice", num_ppo_epochs=2, total_episodes=4))
    assert once[0]["val/ratio_var"] == pytest.approx(0.0, abs=1e-12)
    assert twice[0]["val/ratio_var"] > 1e-12


# -- prompts ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", ["pythia", "gpt2", "llama3", "qwen2.5", "mistral", "gemma"])
def test_prompts_begin_as_the_family_begins_them(family: str, family_models: dict[str, Path], tmp_path: Path) -> None:
    """Plain text gets the BOS token where the family's tokenizer adds one (Llama 3, Mistral, Gemma), as TRL's
    PPO example tokenized; a chat template that writes BOS itself gets it once."""
    from transformers import AutoTokenizer

    source = family_models[family]
    tokenizer = AutoTokenizer.from_pretrained(source)
    adds_bos = tokenizer("a tree").input_ids[0] == tokenizer.bos_token_id
    datasets = [PROMPTS] + ([chat_prompts(tmp_path / "chat.jsonl")] if tokenizer.chat_template else [])
    for prompts in datasets:
        trainer = build(source, tmp_path / prompts.stem, prompts=prompts)
        for row in trainer.train_dataset:
            ids = row["input_ids"]
            assert (ids[0] == tokenizer.bos_token_id) == adds_bos and ids[1:].count(tokenizer.bos_token_id) == 0


def test_max_steps_counts_updates_as_for_every_algorithm(family_models: dict[str, Path], tmp_path: Path) -> None:
    """`rlhf ppo --max-steps 3`: three updates, whatever the episodes would have given."""
    trainer = build(family_models["pythia"], tmp_path / "run", total_episodes=None, max_steps=3)
    assert trainer.num_updates == 3
    assert build(family_models["pythia"], tmp_path / "episodes").num_updates == 2  # total_episodes 8, 4 an update


def test_vllm_refuses_a_policy_resized_for_its_pad_token(family_models: dict[str, Path], tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The ranks' own check, for a hub policy the pre-launch one could not read: GPT-2 gets a pad token and a row
    for it, and vLLM would hold the checkpoint's rows; pythia's spare rows take the pad token without resizing."""
    from rlhf_cli.rank.engines import vllm

    monkeypatch.setattr(vllm, "install", lambda config, inputs: None)  # no engine is built before it
    with pytest.raises(ValueError, match="resized from 481 rows for the pad token PPO added"):
        build(family_models["gpt2"], tmp_path / "gpt2", use_vllm=True)
    monkeypatch.setattr("rlhf_cli.rank.ppo.trainer.PPOTrainer.__init__", lambda self, **kwargs: None)
    build(family_models["pythia"], tmp_path / "pythia", use_vllm=True)  # built (its vLLM rollouts stubbed out)


def test_max_grad_norm_clips_without_deepspeed_too(family_models: dict[str, Path], tmp_path: Path) -> None:
    """As DeepSpeed's gradient_clipping does under ZeRO (TRL 1.12's loop never clipped): clipped to a norm far below
    Adam's eps, a step barely moves the weights; 0 turns clipping off."""
    import torch

    def moved(max_grad_norm: float) -> float:
        trainer = build(family_models["gemma"], tmp_path / f"out-{max_grad_norm}", total_episodes=4,
                        max_grad_norm=max_grad_norm, recorder=Recorder(lambda n: [float(i % 2) for i in range(n)]))
        before = {name: p.detach().clone() for name, p in trainer.policy_and_value.named_parameters()}
        trainer.train()
        return max((p.detach() - before[name]).abs().max().item()
                   for name, p in trainer.policy_and_value.named_parameters())

    with torch.random.fork_rng():
        unclipped, clipped = moved(0.0), moved(1e-12)
    assert unclipped > 1e-4 and clipped < unclipped / 100, (unclipped, clipped)


def test_vllms_importance_sampling_weights_reach_the_policy_loss(family_models: dict[str, Path], tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The same rollouts, scored by "vLLM" far below the policy (-100 a token): every importance-sampling ratio
    is above clip_max (3). `token_truncate` weighs each token 3, so a plain SGD step (no clipping) moves the policy
    three times as far as without the correction; TRL's default `sequence_mask` weighs every sequence 0, so the
    update leaves the policy as it was."""
    import torch

    def update(name: str, **settings: Any) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
        trainer = build(family_models["gemma"], tmp_path / name, total_episodes=4, optim="sgd", learning_rate=0.1,
                        max_grad_norm=0.0, recorder=Recorder(lambda n: [float(i % 2) for i in range(n)]),
                        **settings)
        generate = trainer.rollouts.generate

        def sampled_by_vllm(queries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            responses, _ = generate(queries)
            return responses, torch.full(responses.shape, -100.0)

        monkeypatch.setattr(trainer.rollouts, "generate", sampled_by_vllm)
        policy = trainer.policy_and_value.policy
        before = {key: param.detach().clone() for key, param in policy.named_parameters()}
        trainer.train()
        return logged(trainer)[0], {key: param.detach() - before[key] for key, param in policy.named_parameters()}

    _, plain = update("plain", vllm_importance_sampling_correction=False)
    truncated, tripled = update("truncated", vllm_importance_sampling_mode="token_truncate")
    masked, unmoved = update("masked")  # TRL's default mode
    assert max(step.abs().max().item() for step in plain.values()) > 1e-4
    assert all(torch.allclose(tripled[key], 3 * plain[key], rtol=1e-3, atol=1e-7) for key in plain)
    assert truncated["sampling/importance_sampling_ratio/min"] == 3.0
    assert all(step.abs().max().item() == 0 for step in unmoved.values())
    assert masked["sampling/importance_sampling_ratio/max"] == 0
