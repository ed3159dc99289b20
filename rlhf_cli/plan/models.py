"""Model sizes from `config.json` alone, by arithmetic: no weights, no torch, no transformers.

A model is found as a local directory or in the Hugging Face hub cache
(`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`), at the run's revision.
The counts follow the module layout of transformers' classes, so that they equal
`sum(p.numel() for p in model.parameters())` and DeepSpeed's "largest layer" (the most parameters
one module owns directly), which `tests/test_plan.py` checks against transformers itself.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlhf_cli.hub import hub_cache

LLAMA_LIKE = ("llama", "mistral", "qwen2", "qwen3")
COMMIT = re.compile(r"^[0-9a-f]{40}$")


class ModelConfigUnavailable(Exception):
    """A model whose config.json cannot be read here; the message says why."""


@dataclass(frozen=True)
class ModelSize:
    """What the memory arithmetic needs to know about one model."""

    params: int  # every parameter, shared ones once
    largest_layer: int  # most parameters held directly by one module (DeepSpeed's estimator input)
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    intermediate: int  # width of the MLP's inner layer
    gated_mlp: bool = True  # llama-like block (RMSNorm, SwiGLU) rather than GPT-NeoX/GPT-2's (LayerNorm, GeLU)
    qk_norm: bool = False  # RMSNorm of each head's queries and keys (qwen3)
    max_positions: int | None = None  # longest sequence the model takes, when its config says
    approximate: bool = False  # an architecture we do not know: counted as a llama-like decoder


@dataclass(frozen=True)
class _Layout:
    """Parameters owned directly by each module of one architecture."""

    embeddings: list[int]  # parameters of each embedding table
    per_layer: list[int]  # parameters of each module inside one decoder layer
    final: list[int]  # final norm(s)
    head: int  # LM head or score head; 0 when tied to the input embedding


def find_config(name_or_path: str, revision: str | None = None) -> Path:
    """config.json of a local model directory, or of a hub id at `revision` in the hub cache."""
    local = Path(name_or_path).expanduser()
    if (local / "config.json").is_file():
        return local / "config.json"
    if local.is_absolute() or name_or_path.startswith((".", "~")):
        raise ModelConfigUnavailable(f"{name_or_path} has no config.json")
    repo = hub_cache() / f"models--{name_or_path.replace('/', '--')}"
    revision = revision or "main"
    commit = revision if COMMIT.match(revision) else None
    if commit is None and (repo / "refs" / revision).is_file():
        commit = (repo / "refs" / revision).read_text().strip()
    config = repo / "snapshots" / (commit or revision) / "config.json"
    if not config.is_file():
        raise ModelConfigUnavailable(
            f"config.json of {name_or_path}@{revision} is not in the hub cache {hub_cache()} "
            f"(`hf download {name_or_path} config.json` fetches it)")
    return config


def read_config(name_or_path: str, revision: str | None = None) -> dict[str, Any]:
    path = find_config(name_or_path, revision)
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ModelConfigUnavailable(f"{path}: not readable JSON ({error.__class__.__name__})") from None
    if not isinstance(config, dict):
        raise ModelConfigUnavailable(f"{path}: not a JSON object")
    return config


def _linear(rows: int, cols: int, bias: bool) -> int:
    return rows * cols + (cols if bias else 0)


def _llama_layout(config: dict[str, Any], hidden: int, heads: int, kv_heads: int, head_dim: int,
                  head: int) -> _Layout:
    """llama, mistral, qwen2, qwen3 and the generic fallback: gated MLP, RMSNorm, GQA."""
    model_type = config.get("model_type")
    inner = config["intermediate_size"]
    attention_bias = bool(config.get("attention_bias", False))
    qkv_bias = model_type == "qwen2" or attention_bias  # qwen2 always has q/k/v biases and never an o bias
    out_bias = attention_bias and model_type != "qwen2"
    mlp_bias = bool(config.get("mlp_bias", False))
    per_layer = [_linear(hidden, heads * head_dim, qkv_bias), _linear(hidden, kv_heads * head_dim, qkv_bias),
                 _linear(hidden, kv_heads * head_dim, qkv_bias), _linear(heads * head_dim, hidden, out_bias),
                 _linear(hidden, inner, mlp_bias), _linear(hidden, inner, mlp_bias), _linear(inner, hidden, mlp_bias),
                 hidden, hidden]
    if model_type == "qwen3":  # per-head RMSNorm of queries and keys
        per_layer += [head_dim, head_dim]
    return _Layout([config["vocab_size"] * hidden], per_layer, [hidden], head)


def _gpt_neox_layout(config: dict[str, Any], hidden: int, head: int) -> _Layout:
    inner = config["intermediate_size"]
    bias = bool(config.get("attention_bias", True))
    per_layer = [2 * hidden, 2 * hidden, _linear(hidden, 3 * hidden, bias), _linear(hidden, hidden, bias),
                 _linear(hidden, inner, True), _linear(inner, hidden, True)]
    return _Layout([config["vocab_size"] * hidden], per_layer, [2 * hidden], head)


def _gpt2_layout(config: dict[str, Any], hidden: int, head: int) -> _Layout:
    inner = config.get("n_inner") or 4 * hidden
    per_layer = [2 * hidden, _linear(hidden, 3 * hidden, True), _linear(hidden, hidden, True), 2 * hidden,
                 _linear(hidden, inner, True), _linear(inner, hidden, True)]
    return _Layout([config["vocab_size"] * hidden, config.get("n_positions", 1024) * hidden], per_layer,
                   [2 * hidden], head)


def model_size(config: dict[str, Any], *, sequence_classifier: bool = False, num_labels: int = 1) -> ModelSize:
    """Parameter counts of a causal LM, or of the same network with a score head (reward and value models)."""
    model_type = config.get("model_type", "")
    try:
        if model_type == "gpt2":
            hidden, layers, heads = config["n_embd"], config["n_layer"], config["n_head"]
            kv_heads = heads
            tied = config.get("tie_word_embeddings", True)
        else:
            hidden, layers, heads = config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"]
            kv_heads = config.get("num_key_value_heads") or heads
            tied = config.get("tie_word_embeddings", model_type not in ("gpt_neox", *LLAMA_LIKE))
        vocab = config["vocab_size"]
        head_dim = config.get("head_dim") or hidden // heads
        head = hidden * num_labels if sequence_classifier else (0 if tied else vocab * hidden)
        if model_type == "gpt2":
            layout = _gpt2_layout(config, hidden, head)
            intermediate = config.get("n_inner") or 4 * hidden
        elif model_type == "gpt_neox":
            layout = _gpt_neox_layout(config, hidden, head)
            intermediate = config["intermediate_size"]
        else:
            layout = _llama_layout(config, hidden, heads, kv_heads, head_dim, head)
            intermediate = config["intermediate_size"]
    except (KeyError, TypeError) as error:
        raise ModelConfigUnavailable(f"config.json of a {model_type or 'model'} lacks {error}") from None
    params = sum(layout.embeddings) + layers * sum(layout.per_layer) + sum(layout.final) + layout.head
    largest = max(*layout.embeddings, *layout.per_layer, *layout.final, layout.head)
    max_positions = config.get("n_positions" if model_type == "gpt2" else "max_position_embeddings")
    return ModelSize(params, largest, layers, hidden, heads, kv_heads, head_dim, vocab, intermediate,
                     gated_mlp=model_type not in ("gpt2", "gpt_neox"), qk_norm=model_type == "qwen3",
                     max_positions=max_positions, approximate=model_type not in ("gpt2", "gpt_neox", *LLAMA_LIKE))
