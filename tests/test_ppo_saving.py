"""What PPO saves and loads, in one process without DeepSpeed: checkpoints that resume the policy and the value
model, checkpoints and logs at fractional steps, each family's LoRA adapter and merged model, models loaded with
the recipe's trust_remote_code."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from helpers import build, logged, rank_inputs, train

FAMILIES = ["pythia", "gpt2", "llama3", "qwen2.5", "mistral", "gemma"]
FOUR_UPDATES = {"total_episodes": 16, "save_strategy": "steps", "save_steps": 2}


def weights(trainer) -> dict[str, Any]:
    return {name: value.detach().clone() for name, value in trainer.policy_and_value.state_dict().items()}


def test_resume_without_deepspeed_restores_the_policy_and_the_value_model(family_models: dict[str, Path],
                                                                         tmp_path: Path) -> None:
    """Before: resume restored optimizer, schedule, RNG and step, but the policy and value model came back at their
    initial weights (transformers loads a model file only into Trainer.model, outside its own loop), and no
    checkpoint held the value model."""
    import torch

    model = family_models["gemma"]
    full = train(model, tmp_path / "full", reward=model, **FOUR_UPDATES)
    resumed = build(model, tmp_path / "resumed", reward=model, **FOUR_UPDATES)
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-2"))
    assert [entry["step"] for entry in logged(resumed)] == [1, 2, 3, 4]
    assert [e["objective/scores"] for e in logged(resumed)[2:]] == \
        pytest.approx([e["objective/scores"] for e in logged(full)[2:]])
    assert [e["loss/value_avg"] for e in logged(resumed)[2:]] == \
        pytest.approx([e["loss/value_avg"] for e in logged(full)[2:]])
    ends = weights(full), weights(resumed)
    assert ends[0].keys() == ends[1].keys()
    assert all(torch.allclose(ends[0][name], ends[1][name], atol=1e-6) for name in ends[0]), \
        [name for name in ends[0] if not torch.allclose(ends[0][name], ends[1][name], atol=1e-6)][:4]


def test_a_checkpoint_from_elsewhere_is_refused_by_resume_without_deepspeed(family_models: dict[str, Path],
                                                                           tmp_path: Path) -> None:
    trainer = build(family_models["gemma"], tmp_path / "out", total_episodes=4)
    (tmp_path / "checkpoint-1").mkdir()
    with pytest.raises(ValueError, match="has no policy_and_value.pt: it was not written by a PPO run without"):
        trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-1"))


def test_fractional_save_and_logging_steps_are_shares_of_the_run(family_models: dict[str, Path],
                                                                tmp_path: Path) -> None:
    """As in TrainingArguments and TRL 1.12; before, 0.5 wrote a checkpoint and a log line at every update."""
    trainer = train(family_models["gemma"], tmp_path / "out", total_episodes=16, save_strategy="steps",
                    save_steps=0.5, logging_steps=0.5)
    assert sorted(path.name for path in (tmp_path / "out").glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    assert [entry["step"] for entry in logged(trainer)] == [2, 4]


def test_trust_remote_code_reaches_every_load(family_models: dict[str, Path], tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: PPO's from_pretrained calls (tokenizer, policy, reference, reward and value model) ignored it."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    seen: list[tuple[str, Any]] = []
    for auto in (AutoTokenizer, AutoModelForCausalLM, AutoModelForSequenceClassification):
        load = auto.from_pretrained.__func__

        def recorded(cls, *args: Any, _load: Any = load, **kwargs: Any) -> Any:
            seen.append((cls.__name__, kwargs.get("trust_remote_code")))
            return _load(cls, *args, **kwargs)

        monkeypatch.setattr(auto, "from_pretrained", classmethod(recorded))
    model = family_models["gemma"]
    build(model, tmp_path / "out", reward=model, trust_remote_code=True)
    assert [name for name, _ in seen].count("AutoModelForCausalLM") == 2  # the policy and its reference
    assert [name for name, _ in seen].count("AutoModelForSequenceClassification") == 2  # reward and value model
    assert all(value is True for _, value in seen), seen


LORA = {"use_peft": True, "lora_r": 4, "merge_adapter": True}


@pytest.mark.parametrize("family", FAMILIES)
def test_each_familys_adapter_and_merged_model_load(family: str, family_models: dict[str, Path],
                                                    tmp_path: Path) -> None:
    """GPT-2, Llama 3 and Mistral get a resized embedding for the added pad token, and PEFT saves it in the
    adapter: the adapter loads on the base resized to the saved tokenizer (rlhf_cli.rank.lora.load_base), and
    --merge-adapter (which crashed rank 0 on a size mismatch after all the training) writes a model that
    from_pretrained loads and that computes what the adapted policy computes."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlhf_cli.rank.lora import load_base, save_merged_model

    model, out = family_models[family], tmp_path / "out"
    trainer = train(model, out, model_values=LORA, total_episodes=4)
    trainer.save_model(str(out))
    save_merged_model(rank_inputs(model, out, model_values=LORA), out)

    ids = torch.tensor([[5, 6, 7, len(trainer.processing_class) - 1]])  # the last token: the added pad, if any
    expected = trainer.policy_and_value.policy.eval()(input_ids=ids).logits
    tokenizer = AutoTokenizer.from_pretrained(out)
    adapted = PeftModel.from_pretrained(load_base(str(model), tokenizer), out).eval()
    assert torch.allclose(adapted(input_ids=ids).logits, expected, atol=1e-5)
    merged = AutoModelForCausalLM.from_pretrained(out / "merged").eval()
    assert torch.allclose(merged(input_ids=ids).logits, expected, atol=1e-4)
    assert len(AutoTokenizer.from_pretrained(out / "merged")) <= merged.config.vocab_size
