"""The modules LoRA can adapt in each decoder architecture, read from config.json by arithmetic: their names as
transformers' `named_modules()` lists them, their shapes, and which LoRA target modules select them.

Resolution checks a run's `lora_target_modules` against these names before launch; the planner sizes the
adapters from these shapes. Without torch or transformers: `tests/test_architectures.py` checks every name and
shape against the modules transformers builds, and the matching against PEFT's own.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

LAYER = "{}"  # stands for the layer index in the path of a decoder layer's module
ALL_LINEAR = "all-linear"  # PEFT's shorthand: every linear module but the output layer
MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# PEFT's targets when none are given (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING in peft.utils.constants)
PEFT_DEFAULT_TARGETS = {"llama": ("q_proj", "v_proj"), "mistral": ("q_proj", "v_proj"), "qwen2": ("q_proj", "v_proj"),
                        "qwen3": ("q_proj", "v_proj"), "gpt_neox": ("query_key_value",), "gpt2": ("c_attn",)}
# Every model type PEFT 0.21 has default targets for (the keys of that mapping; tests/test_architectures.py compares
# them): any other model's LoRA must name its target modules, or PEFT stops every rank after loading the model
PEFT_DEFAULTED_MODEL_TYPES = frozenset({
    "t5", "mt5", "bart", "gpt2", "bloom", "blip-2", "opt", "gptj", "gpt_neox", "gpt_neo", "bert", "roberta",
    "xlm-roberta", "electra", "deberta-v2", "deberta", "layoutlm", "llama", "llama4", "chatglm", "gpt_bigcode", "mpt",
    "RefinedWebModel", "RefinedWeb", "falcon", "btlm", "codegen", "mistral", "mixtral", "stablelm", "phi", "gemma",
    "gemma2", "gemma3_text", "gemma4", "qwen2", "qwen3", "nemotron_h", "rwkv", "rwkv7"})
# What a module reads, for the activations its adapter keeps: modules reading the same tensor share it.
ATTENTION_INPUT, ATTENTION_OUTPUT, MLP_INPUT, MLP_INNER, FINAL_HIDDEN, TOKENS = (
    "attention input", "attention output", "MLP input", "MLP inner", "final hidden", "token ids")


@dataclass(frozen=True)
class Module:
    """A linear (or embedding) module: LoRA adds A (rank x in_features) and B (out_features x rank)."""

    path: str  # as named_modules() names it; LAYER for the layer index
    in_features: int  # an embedding's: its vocabulary
    out_features: int
    reads: str
    embedding: bool = False

    @property
    def name(self) -> str:
        return self.path.rsplit(".", 1)[-1]

    def paths(self, layers: int) -> list[str]:
        return [self.path.format(index) for index in range(layers)] if LAYER in self.path else [self.path]


@dataclass(frozen=True)
class Architecture:
    model_type: str
    layers: int
    modules: tuple[Module, ...]
    output_layer: str  # the LM head, or a classifier's score head: never in `all-linear`

    def names(self) -> list[str]:
        """The modules' short names, each once, in the model's order."""
        return list(dict.fromkeys(module.name for module in self.modules))


def _llama(config: dict[str, Any], head: Module) -> tuple[Module, ...]:
    hidden, inner = config["hidden_size"], config["intermediate_size"]
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    q, kv = heads * head_dim, (config.get("num_key_value_heads") or heads) * head_dim
    attention, mlp = f"model.layers.{LAYER}.self_attn.", f"model.layers.{LAYER}.mlp."
    return (Module("model.embed_tokens", config["vocab_size"], hidden, TOKENS, embedding=True),
            Module(attention + "q_proj", hidden, q, ATTENTION_INPUT),
            Module(attention + "k_proj", hidden, kv, ATTENTION_INPUT),
            Module(attention + "v_proj", hidden, kv, ATTENTION_INPUT),
            Module(attention + "o_proj", q, hidden, ATTENTION_OUTPUT),
            Module(mlp + "gate_proj", hidden, inner, MLP_INPUT),
            Module(mlp + "up_proj", hidden, inner, MLP_INPUT),
            Module(mlp + "down_proj", inner, hidden, MLP_INNER), head)


def _gpt_neox(config: dict[str, Any], head: Module) -> tuple[Module, ...]:
    hidden, inner = config["hidden_size"], config["intermediate_size"]
    attention, mlp = f"gpt_neox.layers.{LAYER}.attention.", f"gpt_neox.layers.{LAYER}.mlp."
    return (Module("gpt_neox.embed_in", config["vocab_size"], hidden, TOKENS, embedding=True),
            Module(attention + "query_key_value", hidden, 3 * hidden, ATTENTION_INPUT),
            Module(attention + "dense", hidden, hidden, ATTENTION_OUTPUT),
            Module(mlp + "dense_h_to_4h", hidden, inner, MLP_INPUT),
            Module(mlp + "dense_4h_to_h", inner, hidden, MLP_INNER), head)


def _gpt2(config: dict[str, Any], head: Module) -> tuple[Module, ...]:
    hidden = config["n_embd"]
    inner = config.get("n_inner") or 4 * hidden
    block = f"transformer.h.{LAYER}."
    return (Module("transformer.wte", config["vocab_size"], hidden, TOKENS, embedding=True),
            Module("transformer.wpe", config.get("n_positions", 1024), hidden, TOKENS, embedding=True),
            Module(block + "attn.c_attn", hidden, 3 * hidden, ATTENTION_INPUT),
            Module(block + "attn.c_proj", hidden, hidden, ATTENTION_OUTPUT),
            Module(block + "mlp.c_fc", hidden, inner, MLP_INPUT),
            Module(block + "mlp.c_proj", inner, hidden, MLP_INNER), head)


LAYOUTS = {"llama": _llama, "mistral": _llama, "qwen2": _llama, "qwen3": _llama, "gpt_neox": _gpt_neox,
           "gpt2": _gpt2}


def architecture(config: dict[str, Any], *, sequence_classifier: bool = False,
                 num_labels: int = 1) -> Architecture | None:
    """The adaptable modules of a causal LM, or of the same network with a score head; None for an architecture
    not listed here (its modules are not known without loading it)."""
    model_type = config.get("model_type", "")
    layout = LAYOUTS.get(model_type)
    if layout is None:
        return None
    hidden = config["n_embd" if model_type == "gpt2" else "hidden_size"]
    layers = config["n_layer" if model_type == "gpt2" else "num_hidden_layers"]
    head_name = "score" if sequence_classifier else "lm_head"  # GPT-NeoX's embed_out too, since transformers 5
    head = Module(head_name, hidden, num_labels if sequence_classifier else config["vocab_size"], FINAL_HIDDEN)
    return Architecture(model_type, layers, layout(config, head), head_name)


def peft_targets(targets: list[str] | None) -> str | list[str] | None:
    """`lora_target_modules` as PEFT gets it from rlhf. TRL's ModelConfig passes a one-entry list on as a string,
    which PEFT reads as a regular expression over whole paths (or as `all-linear`): `[q_proj]` would then select
    nothing inside a layer. A plain module name stays a list, matched as a suffix like the names of a longer list."""
    if targets is not None and len(targets) == 1 and not MODULE_NAME.match(targets[0]):
        return targets[0]
    return targets


def default_targets(model_type: str) -> tuple[str, ...] | None:
    """PEFT's target modules when none are given; None: PEFT has none and asks for them."""
    return PEFT_DEFAULT_TARGETS.get(model_type)


def peft_has_default(model_type: str) -> bool:
    """Whether PEFT adapts a `model_type` model without `target_modules` (PEFT_DEFAULTED_MODEL_TYPES)."""
    return model_type in PEFT_DEFAULTED_MODEL_TYPES


def selects(target: str | Sequence[str], path: str) -> bool:
    """Whether PEFT's `target_modules` selects the module at `path`: a string is a regular expression over the
    whole path, a list holds names matched as the path or a suffix after a dot (peft's check_target_module_exists)."""
    if isinstance(target, str):
        try:
            return re.fullmatch(target, path) is not None
        except re.error:  # resolution reports the pattern
            return False
    return any(path == name or path.endswith(f".{name}") for name in target)


def targeted(arch: Architecture, targets: str | Sequence[str]) -> list[tuple[Module, int | None]]:
    """(module, layer index or None outside the layers) of every module `targets` selects; `all-linear` selects
    every linear module but the output layer, as PEFT does."""
    return [(module, index) for module, layers in selection(arch, targets)
            for index in (layers if layers is not None else (None,))]


def selection(arch: Architecture, targets: str | Sequence[str]) -> list[tuple[Module, Sequence[int] | None]]:
    """`targeted`, with the layers of each module as a range or list of indices (None: outside the layers): a
    module selected in every layer is one entry, so that the plan of any depth takes no longer than of one."""
    found: list[tuple[Module, Sequence[int] | None]] = []
    for module in arch.modules:
        every_layer = _selects_every_layer(module, targets)
        if every_layer is not None:  # decided once for all layers
            found += [(module, range(arch.layers))] if every_layer and arch.layers else []
            continue
        chosen = [index for index, path in enumerate(module.paths(arch.layers))
                  if (not module.embedding and path != arch.output_layer if isinstance(targets, str)
                      and targets.lower() == ALL_LINEAR else selects(targets, path))]
        if chosen:
            found.append((module, chosen if LAYER in module.path else None))
    return found


def _selects_every_layer(module: Module, targets: str | Sequence[str]) -> bool | None:
    """Whether `targets` selects a layer module in every layer or in none, when its path after the layer index
    decides that alone (`all-linear`, or names no longer than that part); None: it depends on the index."""
    if LAYER not in module.path:
        return None
    tail = module.path.split(LAYER, 1)[1]  # `.self_attn.q_proj`
    if isinstance(targets, str):
        return not module.embedding if targets.lower() == ALL_LINEAR else None
    if any(len(name) + 1 > len(tail) for name in targets):
        return None  # a name as long as the path may name one layer's module (`layers.3.self_attn.q_proj`)
    return any(tail.endswith(f".{name}") for name in targets)
