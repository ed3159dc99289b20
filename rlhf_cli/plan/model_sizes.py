"""Model sizes from `config.json` alone, by arithmetic: no weights, no torch, no transformers.

A model's config.json is found as a local directory or in the Hugging Face hub cache, at the run's revision
(`rlhf_cli.models.hub.read_config`).
The counts follow the module layout of transformers' classes, so that they equal
`sum(p.numel() for p in model.parameters())` and DeepSpeed's "largest layer" (the most parameters
one module owns directly), which `tests/test_plan.py` checks against transformers itself.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from rlhf_cli.generation.budget import Stretch, Unit, stretches
from rlhf_cli.models.architectures import LAYER, Module, architecture, default_targets, selection
from rlhf_cli.models.hub import ModelConfigUnavailable

LLAMA_LIKE = ("llama", "mistral", "qwen2", "qwen3")
# Modules of a decoder layer that hold no parameter themselves (the layer, attention, MLP, activation, dropouts):
# ZeRO-3 hooks them too. llama-like: 4.
PARAMETERLESS_PER_LAYER = {"gpt2": 7, "gpt_neox": 6}


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
    units: tuple[Unit, ...] = ()  # what a gather budget can buy of a causal LM (rlhf_cli/generation/budget.py)

    @cached_property
    def stretches(self) -> tuple[Stretch, ...]:
        """`units` with alike neighbours together: what the plan counts in, at a cost that does not grow with
        the depth."""
        return stretches(self.units)


@dataclass(frozen=True)
class _Layout:
    """Parameters owned directly by each module of one architecture."""

    embeddings: list[int]  # parameters of each embedding table
    per_layer: list[int]  # parameters of each module inside one decoder layer
    final: list[int]  # final norm(s)
    head: int  # LM head or score head; 0 when tied to the input embedding


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
    except ZeroDivisionError:
        raise ModelConfigUnavailable(f"config.json of a {model_type or 'model'} has no attention heads") from None
    params = sum(layout.embeddings) + layers * sum(layout.per_layer) + sum(layout.final) + layout.head
    largest = max(*layout.embeddings, *layout.per_layer, *layout.final, layout.head)
    max_positions = config.get("n_positions" if model_type == "gpt2" else "max_position_embeddings")
    units = () if sequence_classifier else _units(layout, layers, PARAMETERLESS_PER_LAYER.get(model_type, 4))
    return ModelSize(params, largest, layers, hidden, heads, kv_heads, head_dim, vocab, intermediate,
                     gated_mlp=model_type not in ("gpt2", "gpt_neox"), qk_norm=model_type == "qwen3",
                     max_positions=max_positions, approximate=model_type not in ("gpt2", "gpt_neox", *LLAMA_LIKE),
                     units=units)


@dataclass(frozen=True)
class LoraSettings:
    """A run's LoRA keys as PEFT gets them (rlhf_cli/rank/lora.py)."""

    rank: int
    targets: str | list[str] | None  # `peft_targets(lora_target_modules)`; None: PEFT's default for the model type
    modules_to_save: tuple[str, ...] = ()
    dropout: bool = True  # lora_dropout > 0 (TRL's default 0.05): each adapter keeps a dropped copy of its input
    dora: bool = False


@dataclass(frozen=True)
class Adapter:
    """LoRA on one model, sized from its config.json: what trains, and where adapters sit for the activations."""

    params: int  # trained: A and B of each adapted module (DoRA: and a magnitude per output), modules_to_save copies
    largest: int  # most trained parameters one module owns: its gradient is materialised whole (lora_A, lora_B...)
    rank: int
    dropout: bool
    layers: tuple[tuple[tuple[Module, ...], int], ...]  # (the adapted modules of a decoder layer, how many layers)
    outside: tuple[Module, ...] = ()  # adapted modules outside the layers (embeddings, the output layer)
    copies: tuple[Module, ...] = ()  # modules_to_save outside the layers, trained whole (a classifier's score head)
    head_trained: bool = False  # the output layer's weight gets a gradient (a modules_to_save copy of it)
    approximate: bool = False  # an architecture we do not know, adapted as a llama-like decoder


def adapter_size(config: dict[str, Any], lora: LoraSettings, *, sequence_classifier: bool = False) -> Adapter:
    """The adapters PEFT adds to a causal LM (or to the same network as a sequence classifier, whose score head
    PEFT trains whole, task SEQ_CLS): A is rank x in, B out x rank, DoRA adds a magnitude per output feature."""
    arch = architecture(config, sequence_classifier=sequence_classifier)
    approximate = arch is None
    if arch is None:
        arch = architecture({**config, "model_type": "llama"}, sequence_classifier=sequence_classifier)
        assert arch is not None
    saved = set(lora.modules_to_save) | ({"classifier", "score"} if sequence_classifier else set())
    targets = lora.targets if lora.targets is not None else default_targets(arch.model_type) or ("q_proj", "v_proj")
    chosen = [(module, layers) for module, layers in selection(arch, targets) if module.name not in saved]
    copies = [module for module in arch.modules if module.name in saved]
    per_module = [(lora.rank * (module.in_features + module.out_features) + (module.out_features if lora.dora else 0))
                  * (len(layers) if layers is not None else 1) for module, layers in chosen]
    copied = [module.in_features * module.out_features * (arch.layers if LAYER in module.path else 1)
              for module in copies]
    largest = max([lora.rank * max(module.in_features, module.out_features) for module, _ in chosen]
                  + [module.in_features * module.out_features for module in copies], default=0)
    layers = _layer_groups(arch.layers, [(module, layers) for module, layers in chosen if layers is not None])
    return Adapter(sum(per_module) + sum(copied), largest, lora.rank, lora.dropout, layers,
                   outside=tuple(module for module, layers in chosen if layers is None),
                   copies=tuple(module for module in copies if LAYER not in module.path),
                   head_trained=any(module.path == arch.output_layer for module in copies),
                   approximate=approximate)


def _layer_groups(count: int, chosen: list[tuple[Module, Sequence[int]]]) -> tuple[tuple[tuple[Module, ...], int], ...]:
    """(the modules adapted in a layer, how many layers have just those): one group when every layer is alike."""
    if all(isinstance(layers, range) and len(layers) == count for _, layers in chosen):
        return ((tuple(module for module, _ in chosen), count),) if count else ()
    per_layer: list[list[Module]] = [[] for _ in range(count)]
    for module, layers in chosen:
        for index in layers:
            per_layer[index].append(module)
    groups = Counter(tuple(modules) for modules in per_layer)
    return tuple(groups.items())


def _units(layout: _Layout, layers: int, parameterless: int) -> tuple[Unit, ...]:
    """A causal LM's units in the order the ranks find them (rlhf_cli.rank.zero3.policy_units): the decoder
    layers, then the embeddings (the first with the LM head when they are tied), the final norms, the LM head."""
    layer = Unit("decoder layer", sum(layout.per_layer), len(layout.per_layer) + parameterless, tuple(layout.per_layer))
    tied = layout.head == 0
    embeddings = [Unit("embedding + LM head" if tied and index == 0 else "embedding", numel, 1 + (tied and index == 0),
                       (numel,)) for index, numel in enumerate(layout.embeddings)]
    final = [Unit("final norm", numel, 1, (numel,)) for numel in layout.final]
    head = [] if tied else [Unit("LM head", layout.head, 1, (layout.head,))]
    return (*[layer] * layers, *embeddings, *final, *head)
