"""Tiny random-weight stand-ins for real model families, with each family's own conventions.

Real checkpoints differ from the smoke models in ways that break RLHF code: no pad token, pad equal to
EOS, several EOS ids, a sampling `generation_config.json`, BOS added or not, dropout on, tied embeddings,
spare embedding rows or none. Each stand-in copies its family's public `config.json`,
`generation_config.json` and tokenizer conventions (special-token strings, which one is BOS/EOS/pad, where
they sit in the vocabulary, the chat template), at hidden size 64 with 2 layers, and a byte-level BPE
trained on `recipes/smoke/corpus.txt` in place of the real 50k-150k vocabulary. Nothing is downloaded;
building all of them takes a few seconds and gives the same files every time:

    python tests/families/build.py OUT_DIR [FAMILY ...]      # writes OUT_DIR/FAMILY/

Tests build them into a temporary directory (`build_all`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CORPUS = Path(__file__).resolve().parents[2] / "recipes" / "smoke" / "corpus.txt"
SEED = 4321
TRAINED_VOCAB = 480  # BPE tokens learnt from the corpus, before the family's special tokens are added
SIZE = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128}
# vLLM's CPU attention runs head sizes 32, 64, 80, ... only: the stand-ins vLLM serves have 2 heads of 64 (one KV
# head where the family groups them, as Qwen2.5-0.5B does), the rest of each family's structure kept.
VLLM_HEADS = {"hidden_size": 128, "num_attention_heads": 2, "head_dim": 64}

LLAMA3_TEMPLATE = (
    "{{- bos_token }}{%- for message in messages %}{{- '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}")
QWEN_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + "
    "'<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a "
    "helpful assistant.<|im_end|>\\n' }}{%- endif %}{%- for message in messages %}{%- if not (message['role'] == "
    "'system' and loop.first) %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>\\n' }}{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}")
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + "
    "message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}"
    "{% endif %}{% endfor %}")
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'assistant' %}{% set role = 'model' %}"
    "{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\\n' + "
    "message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<start_of_turn>model\\n' }}{% endif %}")
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                   "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>",
                   "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]


@dataclass(frozen=True)
class Family:
    """One family's conventions. Token fields name special-token strings; `*_ids` fields are resolved to ids."""

    name: str
    model_type: str
    real: str  # the checkpoints whose public files this copies
    architecture: Callable[[Any], Any]  # tokenizer -> transformers config
    specials_first: list[str] = field(default_factory=list)  # special tokens at ids 0, 1, ... (before the BPE)
    specials_last: list[str] = field(default_factory=list)  # appended after the BPE vocabulary
    bos: str | None = None
    eos: str | None = None
    pad: str | None = None
    unk: str | None = None
    adds_bos: bool = False  # the tokenizer puts BOS before every text
    chat_template: str | None = None
    spare_rows: bool = False  # the embedding has more rows than the tokenizer has tokens
    generation: dict[str, Any] = field(default_factory=dict)  # generation_config.json, token strings as ids


def _id(tokenizer: Any, token: str | None) -> int | None:
    return None if token is None else tokenizer.convert_tokens_to_ids(token)


def _rows(tokenizer: Any, spare: bool) -> int:
    """Embedding rows: the tokenizer's size, or rounded up to a multiple of 128 with some left over."""
    size = len(tokenizer)
    return (size // 128 + 1) * 128 if spare else size


def gpt_neox(tokenizer: Any) -> Any:
    from transformers import GPTNeoXConfig

    return GPTNeoXConfig(
        vocab_size=_rows(tokenizer, True), **{**SIZE, "intermediate_size": 256}, rotary_pct=0.25,
        rotary_emb_base=10000, use_parallel_residual=True, hidden_act="gelu", layer_norm_eps=1e-5,
        max_position_embeddings=2048, tie_word_embeddings=False, attention_dropout=0.0, hidden_dropout=0.0,
        bos_token_id=_id(tokenizer, "<|endoftext|>"), eos_token_id=_id(tokenizer, "<|endoftext|>"),
        architectures=["GPTNeoXForCausalLM"])


def gpt2(tokenizer: Any) -> Any:
    from transformers import GPT2Config

    end = _id(tokenizer, "<|endoftext|>")
    return GPT2Config(
        vocab_size=_rows(tokenizer, False), n_positions=1024, n_embd=64, n_layer=2, n_head=4,
        activation_function="gelu_new", resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1, layer_norm_epsilon=1e-5,
        tie_word_embeddings=True, bos_token_id=end, eos_token_id=end, architectures=["GPT2LMHeadModel"])


def llama3(tokenizer: Any) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=_rows(tokenizer, False), **SIZE, num_key_value_heads=2, hidden_act="silu",
        max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=False, attention_bias=False,
        mlp_bias=False, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8192},
        bos_token_id=_id(tokenizer, "<|begin_of_text|>"),
        eos_token_id=[_id(tokenizer, t) for t in ("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>")],
        architectures=["LlamaForCausalLM"])


def qwen2(tokenizer: Any) -> Any:
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=_rows(tokenizer, True), **SIZE, num_key_value_heads=2, hidden_act="silu",
        max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True,
        use_sliding_window=False, sliding_window=None, attention_dropout=0.0,
        bos_token_id=_id(tokenizer, "<|endoftext|>"), eos_token_id=_id(tokenizer, "<|im_end|>"),
        architectures=["Qwen2ForCausalLM"])


def mistral(tokenizer: Any) -> Any:
    from transformers import MistralConfig

    # The real window is 4096 tokens; 16 here so that prompt and response together cross it.
    return MistralConfig(
        vocab_size=_rows(tokenizer, False), **SIZE, num_key_value_heads=2, head_dim=16, hidden_act="silu",
        max_position_embeddings=32768, rms_norm_eps=1e-5, rope_theta=10000.0, sliding_window=16,
        tie_word_embeddings=False, bos_token_id=_id(tokenizer, "<s>"), eos_token_id=_id(tokenizer, "</s>"),
        architectures=["MistralForCausalLM"])


def gemma(tokenizer: Any) -> Any:
    from transformers import GemmaConfig

    return GemmaConfig(
        vocab_size=_rows(tokenizer, False), **SIZE, num_key_value_heads=1, head_dim=16,
        hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh", max_position_embeddings=8192,
        rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=True, attention_bias=False,
        pad_token_id=_id(tokenizer, "<pad>"), eos_token_id=_id(tokenizer, "<eos>"),
        bos_token_id=_id(tokenizer, "<bos>"), architectures=["GemmaForCausalLM"])


def granite(tokenizer: Any) -> Any:
    from transformers import GraniteConfig

    end = _id(tokenizer, "<|end_of_text|>")
    # ibm-granite/granite-3.1-2b-instruct's multipliers (attention 1/64: 1/head_dim at head size 64)
    return GraniteConfig(
        vocab_size=_rows(tokenizer, False), **SIZE, num_key_value_heads=2, hidden_act="silu",
        max_position_embeddings=131072, rms_norm_eps=1e-5, rope_parameters={"rope_type": "default",
                                                                             "rope_theta": 5000000.0},
        tie_word_embeddings=True, attention_bias=False, attention_dropout=0.1, mlp_bias=False,
        embedding_multiplier=12.0, logits_scaling=8.0, residual_multiplier=0.22, attention_multiplier=0.015625,
        bos_token_id=end, eos_token_id=end, pad_token_id=end, architectures=["GraniteForCausalLM"])


def olmo2(tokenizer: Any) -> Any:
    from transformers import Olmo2Config

    return Olmo2Config(
        vocab_size=_rows(tokenizer, True), **SIZE, num_key_value_heads=4, hidden_act="silu",
        max_position_embeddings=4096, rms_norm_eps=1e-6, rope_parameters={"rope_type": "default",
                                                                           "rope_theta": 500000.0},
        tie_word_embeddings=False, attention_bias=False, attention_dropout=0.0,
        eos_token_id=_id(tokenizer, "<|endoftext|>"), pad_token_id=_id(tokenizer, "<|pad|>"),
        architectures=["Olmo2ForCausalLM"])


def smollm3(tokenizer: Any) -> Any:
    from transformers import SmolLM3Config

    # No rotary embedding in every 4th layer (`no_rope_layers`): layer 1 of 2 here keeps it, layer 2 has none
    return SmolLM3Config(
        vocab_size=_rows(tokenizer, False), **SIZE, num_key_value_heads=1, hidden_act="silu",
        max_position_embeddings=65536, rms_norm_eps=1e-6, rope_parameters={"rope_type": "default",
                                                                            "rope_theta": 5000000.0},
        no_rope_layers=[1, 0], no_rope_layer_interval=4, use_sliding_window=False, sliding_window=None,
        tie_word_embeddings=True, attention_bias=False, attention_dropout=0.0, mlp_bias=False,
        bos_token_id=None, eos_token_id=_id(tokenizer, "<|im_end|>"),
        pad_token_id=_id(tokenizer, "<|finetune_right_pad_id|>"), architectures=["SmolLM3ForCausalLM"])


def cohere(tokenizer: Any) -> Any:
    from transformers import CohereConfig

    # CohereForAI/c4ai-command-r-08-2024: parallel attention and MLP on one LayerNorm, logits scaled by 1/16, tied
    return CohereConfig(
        vocab_size=_rows(tokenizer, False), **SIZE, num_key_value_heads=2, hidden_act="silu",
        max_position_embeddings=131072, layer_norm_eps=1e-5, rope_parameters={"rope_type": "default",
                                                                               "rope_theta": 4000000.0},
        logit_scale=0.0625, use_qk_norm=False, tie_word_embeddings=True, attention_bias=False, attention_dropout=0.0,
        bos_token_id=_id(tokenizer, "<BOS_TOKEN>"), eos_token_id=_id(tokenizer, "<|END_OF_TURN_TOKEN|>"),
        pad_token_id=_id(tokenizer, "<PAD>"), architectures=["CohereForCausalLM"])


def stablelm(tokenizer: Any) -> Any:
    from transformers import StableLmConfig

    # stabilityai/stablelm-2-1_6b: LayerNorm, q/k/v biases, rotary on a quarter of each head, spare embedding rows
    end = _id(tokenizer, "<|endoftext|>")
    return StableLmConfig(
        vocab_size=_rows(tokenizer, True), **SIZE, num_key_value_heads=4, hidden_act="silu",
        max_position_embeddings=4096, layer_norm_eps=1e-5, use_qkv_bias=True, qk_layernorm=False,
        use_parallel_residual=False, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                      "partial_rotary_factor": 0.25},
        tie_word_embeddings=False, hidden_dropout=0.0, attention_dropout=0.0, bos_token_id=end, eos_token_id=end,
        architectures=["StableLmForCausalLM"])


def phi3(tokenizer: Any) -> Any:
    from transformers import Phi3Config

    # microsoft/Phi-3-mini-4k-instruct: q/k/v fused in one qkv_proj, gate and up in one gate_up_proj, spare rows
    end = _id(tokenizer, "<|endoftext|>")
    return Phi3Config(
        vocab_size=_rows(tokenizer, True), **SIZE, num_key_value_heads=4, hidden_act="silu",
        max_position_embeddings=4096, original_max_position_embeddings=4096, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, sliding_window=2047,
        tie_word_embeddings=False, resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0,
        bos_token_id=_id(tokenizer, "<s>"), eos_token_id=end, pad_token_id=end, architectures=["Phi3ForCausalLM"])


COHERE_TEMPLATE = (
    "{{ bos_token }}{%- for message in messages %}{{- '<|START_OF_TURN_TOKEN|>' + ('<|USER_TOKEN|>' if "
    "message['role'] == 'user' else '<|CHATBOT_TOKEN|>' if message['role'] == 'assistant' else '<|SYSTEM_TOKEN|>') + "
    "message['content'] + '<|END_OF_TURN_TOKEN|>' }}{%- endfor %}{%- if add_generation_prompt %}"
    "{{- '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' }}{%- endif %}")
GRANITE_TEMPLATE = (
    "{%- for message in messages %}{{- '<|start_of_role|>' + message['role'] + '<|end_of_role|>' + "
    "message['content'] + '<|end_of_text|>\n' }}{%- endfor %}{%- if add_generation_prompt %}"
    "{{- '<|start_of_role|>assistant<|end_of_role|>' }}{%- endif %}")
GRANITE_SPECIALS = ["<|end_of_text|>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>", "<filename>",
                    "<gh_stars>", "<issue_start>", "<issue_comment>", "<issue_closed>", "<jupyter_start>",
                    "<jupyter_text>", "<jupyter_code>", "<jupyter_output>", "<empty_output>", "<commit_before>",
                    "<commit_msg>", "<commit_after>", "<reponame>"]
PHI3_TEMPLATE = (
    "{% for message in messages %}{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}")
PHI3_SPECIALS = ["<|endoftext|>", "<|assistant|>", "<|placeholder1|>", "<|placeholder2|>", "<|placeholder3|>",
                 "<|placeholder4|>", "<|system|>", "<|end|>", "<|placeholder5|>", "<|placeholder6|>", "<|user|>"]
CHATML_TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}")

FAMILIES: dict[str, Family] = {family.name: family for family in (
    Family("pythia", "gpt_neox", "EleutherAI/pythia-70m ... pythia-12b", gpt_neox,
           specials_first=["<|endoftext|>", "<|padding|>"], bos="<|endoftext|>", eos="<|endoftext|>",
           unk="<|endoftext|>", spare_rows=True,
           generation={"bos_token_id": "<|endoftext|>", "eos_token_id": "<|endoftext|>"}),
    Family("gpt2", "gpt2", "openai-community/gpt2", gpt2, specials_last=["<|endoftext|>"],
           bos="<|endoftext|>", eos="<|endoftext|>", unk="<|endoftext|>",
           generation={"bos_token_id": "<|endoftext|>", "eos_token_id": "<|endoftext|>"}),
    Family("llama3", "llama", "meta-llama/Llama-3.1-8B-Instruct", llama3, specials_last=LLAMA3_SPECIALS,
           bos="<|begin_of_text|>", eos="<|eot_id|>", adds_bos=True, chat_template=LLAMA3_TEMPLATE,
           generation={"bos_token_id": "<|begin_of_text|>", "do_sample": True,
                       "eos_token_id": ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"], "temperature": 0.6,
                       "top_p": 0.9}),
    Family("qwen2.5", "qwen2", "Qwen/Qwen2.5-1.5B-Instruct (tied embeddings), 7B's sampling settings", qwen2,
           specials_last=["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
                          "<|object_ref_end|>"],
           eos="<|im_end|>", pad="<|endoftext|>", chat_template=QWEN_TEMPLATE, spare_rows=True,
           generation={"bos_token_id": "<|endoftext|>", "pad_token_id": "<|endoftext|>", "do_sample": True,
                       "eos_token_id": ["<|im_end|>", "<|endoftext|>"], "repetition_penalty": 1.05,
                       "temperature": 0.7, "top_p": 0.8, "top_k": 20}),
    Family("mistral", "mistral", "mistralai/Mistral-7B-Instruct-v0.1", mistral,
           specials_first=["<unk>", "<s>", "</s>"], bos="<s>", eos="</s>", unk="<unk>", adds_bos=True,
           chat_template=MISTRAL_TEMPLATE, generation={"bos_token_id": "<s>", "eos_token_id": "</s>"}),
    Family("gemma", "gemma", "google/gemma-2b-it", gemma,
           specials_first=["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"], bos="<bos>",
           eos="<eos>", pad="<pad>", unk="<unk>", adds_bos=True, chat_template=GEMMA_TEMPLATE,
           generation={"bos_token_id": "<bos>", "eos_token_id": "<eos>", "pad_token_id": "<pad>"}),
)}
# Families the vLLM sync's fidelity is checked on (tests/test_vllm_sync.py, benchmarks/families_vllm.py), outside the
# launched conformance matrix: heads scaled by `logits_scaling` (Granite) and `logit_scale` (Cohere), two that vLLM
# 0.30 serves through its Transformers backend, partial rotary with LayerNorm and q/k/v biases
# (StableLM), and q/k/v and gate/up fused in one module each (Phi-3).
VLLM_FAMILIES: dict[str, Family] = {family.name: family for family in (
    Family("granite", "granite", "ibm-granite/granite-3.1-2b-instruct", granite, specials_first=GRANITE_SPECIALS,
           specials_last=["<|start_of_role|>", "<|end_of_role|>", "<|tool_call|>"], bos="<|end_of_text|>",
           eos="<|end_of_text|>", pad="<|end_of_text|>", unk="<|end_of_text|>", chat_template=GRANITE_TEMPLATE,
           generation={"bos_token_id": "<|end_of_text|>", "eos_token_id": "<|end_of_text|>",
                       "pad_token_id": "<|end_of_text|>"}),
    Family("olmo2", "olmo2", "allenai/OLMo-2-0425-1B-Instruct", olmo2,
           specials_last=["<|endoftext|>", "<|pad|>", "<|im_start|>", "<|im_end|>"], bos="<|endoftext|>",
           eos="<|endoftext|>", pad="<|pad|>", chat_template=CHATML_TEMPLATE, spare_rows=True,
           generation={"bos_token_id": "<|endoftext|>", "eos_token_id": "<|endoftext|>",
                       "pad_token_id": "<|pad|>"}),
    Family("smollm3", "smollm3", "HuggingFaceTB/SmolLM3-3B", smollm3, specials_last=LLAMA3_SPECIALS[:5] + [
               "<|im_start|>", "<|im_end|>"], bos=None, eos="<|im_end|>", pad="<|finetune_right_pad_id|>",
           chat_template=CHATML_TEMPLATE,
           generation={"eos_token_id": "<|im_end|>", "pad_token_id": "<|finetune_right_pad_id|>",
                       "do_sample": True, "temperature": 0.6, "top_p": 0.95}),
    Family("cohere", "cohere", "CohereForAI/c4ai-command-r-08-2024", cohere,
           specials_first=["<PAD>", "<UNK>", "<CLS>", "<SEP>", "<MASK_TOKEN>", "<BOS_TOKEN>", "<EOS_TOKEN>",
                           "<EOP_TOKEN>"],
           specials_last=["<|START_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>", "<|USER_TOKEN|>", "<|CHATBOT_TOKEN|>",
                          "<|SYSTEM_TOKEN|>"],
           bos="<BOS_TOKEN>", eos="<|END_OF_TURN_TOKEN|>", pad="<PAD>", unk="<UNK>", adds_bos=True,
           chat_template=COHERE_TEMPLATE,
           generation={"bos_token_id": "<BOS_TOKEN>", "eos_token_id": "<|END_OF_TURN_TOKEN|>",
                       "pad_token_id": "<PAD>"}),
    Family("stablelm", "stablelm", "stabilityai/stablelm-2-1_6b", stablelm, specials_last=["<|endoftext|>"],
           bos="<|endoftext|>", eos="<|endoftext|>", unk="<|endoftext|>", spare_rows=True,
           generation={"bos_token_id": "<|endoftext|>", "eos_token_id": "<|endoftext|>"}),
    Family("phi3", "phi3", "microsoft/Phi-3-mini-4k-instruct", phi3, specials_first=["<unk>", "<s>", "</s>"],
           specials_last=PHI3_SPECIALS, bos="<s>", eos="<|endoftext|>", pad="<|endoftext|>", unk="<unk>",
           chat_template=PHI3_TEMPLATE,
           generation={"bos_token_id": "<s>", "eos_token_id": ["<|endoftext|>", "<|assistant|>", "<|end|>"],
                       "pad_token_id": "<|endoftext|>"}),
)}
EVERY_FAMILY = {**FAMILIES, **VLLM_FAMILIES}


def build_tokenizer(family: Family, corpus: Path = CORPUS) -> Any:
    """A byte-level BPE learnt from `corpus`, with the family's special tokens where the family has them."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE(unk_token=None))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TRAINED_VOCAB + len(family.specials_first), min_frequency=2,
                                  special_tokens=family.specials_first, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(corpus.read_text().splitlines(), trainer=trainer)
    backend.add_special_tokens(family.specials_last)
    if family.adds_bos:
        bos = backend.token_to_id(family.bos)
        backend.post_processor = processors.TemplateProcessing(
            single=f"{family.bos} $A", pair=f"{family.bos} $A {family.bos} $B", special_tokens=[(family.bos, bos)])
    else:
        backend.post_processor = processors.ByteLevel(trim_offsets=False)
    named = {role: token for role, token in (("bos_token", family.bos), ("eos_token", family.eos),
                                              ("pad_token", family.pad), ("unk_token", family.unk)) if token}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, model_max_length=2048, **named)
    tokenizer.chat_template = family.chat_template
    return tokenizer


def _generation_config(family: Family, tokenizer: Any) -> Any:
    from transformers import GenerationConfig

    values = {}
    for key, value in family.generation.items():
        if key.endswith("token_id"):
            value = [_id(tokenizer, v) for v in value] if isinstance(value, list) else _id(tokenizer, value)
        values[key] = value
    return GenerationConfig(**values)


def for_vllm(config: Any) -> Any:
    """`config` with heads vLLM's CPU attention runs (VLLM_HEADS), one KV head where the family has KV heads."""
    for key, value in VLLM_HEADS.items():
        if key != "head_dim" or getattr(config, "head_dim", None) is not None:
            setattr(config, config.attribute_map.get(key, key), value)
    if getattr(config, "num_key_value_heads", None) is not None:
        config.num_key_value_heads = 1
    return config


def build_family(name: str, out: Path, vllm: bool = False) -> Path:
    """Write the stand-in of family `name` (model, tokenizer, generation config) to `out`, with heads vLLM runs
    when `vllm` (`for_vllm`); returns `out`."""
    import torch
    from transformers import AutoModelForCausalLM

    family = EVERY_FAMILY[name]
    tokenizer = build_tokenizer(family)
    config = family.architecture(tokenizer)
    if vllm:
        config = for_vllm(config)
    torch.manual_seed(SEED + list(EVERY_FAMILY).index(name))
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config = _generation_config(family, tokenizer)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def build_all(out: Path, names: list[str] | None = None, vllm: bool = False) -> dict[str, Path]:
    """Every family (or those named) under `out/NAME/`."""
    return {name: build_family(name, out / name, vllm) for name in names or FAMILIES}


def main(argv: list[str]) -> None:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        print(f"\nfamilies: {', '.join(EVERY_FAMILY)}")
        return
    out, names = Path(argv[0]), argv[1:]
    unknown = [name for name in names if name not in EVERY_FAMILY]
    if unknown:
        sys.exit(f"unknown family {', '.join(unknown)}; one of {', '.join(EVERY_FAMILY)}")
    for name, path in build_all(out, names or None).items():
        print(f"{name}: {path} ({EVERY_FAMILY[name].real})")


if __name__ == "__main__":
    main(sys.argv[1:])
