"""The model-family stand-ins carry the conventions that real checkpoints of each family have."""

from __future__ import annotations

import json
from pathlib import Path

from families.build import FAMILIES, build_family


def load(path: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)


def generation_config(path: Path) -> dict:
    return json.loads((path / "generation_config.json").read_text())


def test_every_stand_in_is_tiny_and_fits_its_tokenizer(family_models: dict[str, Path]) -> None:
    assert set(family_models) == set(FAMILIES)
    for name, path in family_models.items():
        tokenizer, model = load(path)
        assert model.config.model_type == FAMILIES[name].model_type
        assert model.config.hidden_size <= 64 and model.config.num_hidden_layers == 2
        assert len(tokenizer) <= model.config.vocab_size and tokenizer.eos_token is not None
        ids = tokenizer("Describe the big tree.", return_tensors="pt").input_ids
        assert model(ids).logits.shape[-1] == model.config.vocab_size


def test_building_twice_gives_the_same_files(family_models: dict[str, Path], tmp_path: Path) -> None:
    again = build_family("gpt2", tmp_path / "gpt2")
    for name in ("model.safetensors", "tokenizer.json", "config.json", "generation_config.json"):
        assert (again / name).read_bytes() == (family_models["gpt2"] / name).read_bytes(), name


def test_families_without_a_pad_token(family_models: dict[str, Path]) -> None:
    """pythia: <|endoftext|> is BOS and EOS, spare embedding rows; GPT-2: the same token last, no spare rows,
    dropout 0.1, tied and learned position embeddings; Llama 3: BOS added, several EOS ids; Mistral: BOS added,
    a sliding window shorter than a prompt and its response."""
    pythia, pythia_model = load(family_models["pythia"])
    assert pythia.pad_token is None and pythia.bos_token == pythia.eos_token == "<|endoftext|>"
    assert pythia.eos_token_id == 0 and pythia_model.config.vocab_size > len(pythia)
    assert pythia_model.config.use_parallel_residual
    assert pythia_model.config.rope_parameters["partial_rotary_factor"] == 0.25

    gpt2, gpt2_model = load(family_models["gpt2"])
    assert gpt2.pad_token is None and gpt2.eos_token_id == len(gpt2) - 1 == gpt2_model.config.vocab_size - 1
    assert gpt2_model.config.resid_pdrop == gpt2_model.config.attn_pdrop == gpt2_model.config.embd_pdrop == 0.1
    assert gpt2_model.lm_head.weight is gpt2_model.transformer.wte.weight and hasattr(gpt2_model.transformer, "wpe")

    llama, _ = load(family_models["llama3"])
    assert llama.pad_token is None and llama.eos_token == "<|eot_id|>"
    assert llama("a tree").input_ids[0] == llama.bos_token_id
    end_ids = [llama.convert_tokens_to_ids(t) for t in ("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>")]
    assert generation_config(family_models["llama3"])["eos_token_id"] == end_ids

    mistral, mistral_model = load(family_models["mistral"])
    assert mistral.pad_token is None and mistral("a tree").input_ids[0] == mistral.bos_token_id
    assert mistral_model.config.sliding_window == 16


def test_families_with_a_pad_token(family_models: dict[str, Path]) -> None:
    """Qwen2.5: pad <|endoftext|>, EOS <|im_end|>, no BOS, a sampling generation config, a chat template;
    Gemma: pad, BOS added, tied embeddings."""
    qwen, qwen_model = load(family_models["qwen2.5"])
    assert (qwen.pad_token, qwen.eos_token, qwen.bos_token) == ("<|endoftext|>", "<|im_end|>", None)
    sampling = generation_config(family_models["qwen2.5"])
    assert sampling["do_sample"] and sampling["repetition_penalty"] > 1 and sampling["top_k"] == 20
    assert sampling["eos_token_id"] == [qwen.eos_token_id, qwen.pad_token_id]
    assert qwen_model.config.tie_word_embeddings and qwen.chat_template

    gemma, gemma_model = load(family_models["gemma"])
    assert (gemma.pad_token_id, gemma.eos_token_id, gemma.bos_token_id) == (0, 1, 2)
    assert gemma_model.config.tie_word_embeddings and gemma("a tree").input_ids[0] == gemma.bos_token_id
    chat = gemma.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert chat.startswith("<bos><start_of_turn>user") and chat.endswith("<start_of_turn>model\n")
