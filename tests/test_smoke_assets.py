"""The shipped smoke models are what recipes/smoke/build.py makes from the bundled text."""

from __future__ import annotations

import importlib.util
import json

from helpers import RECIPES


def load_builder():
    spec = importlib.util.spec_from_file_location("smoke_build", RECIPES / "smoke" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tokenizer_is_trained_on_the_bundled_corpus() -> None:
    tokenizer = load_builder().build_tokenizer(RECIPES / "smoke" / "corpus.txt")
    shipped = json.loads((RECIPES / "smoke" / "policy" / "tokenizer.json").read_text())
    assert json.loads(tokenizer.backend_tokenizer.to_str())["model"]["vocab"] == shipped["model"]["vocab"]


def test_models_load_offline_and_fit_their_tokenizer() -> None:
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(RECIPES / "smoke" / "policy")
    policy = AutoModelForCausalLM.from_pretrained(RECIPES / "smoke" / "policy")
    reward = AutoModelForSequenceClassification.from_pretrained(RECIPES / "smoke" / "reward")
    assert policy.config.vocab_size == len(tokenizer) and reward.config.num_labels == 1
    assert tokenizer.pad_token and tokenizer.eos_token and tokenizer.chat_template
    ids = tokenizer("Describe the big tree.", return_tensors="pt").input_ids
    assert policy(ids).logits.shape[-1] == len(tokenizer)
