"""Whether a LoRA run's colocated vLLM serves the adapters itself (vLLM's LoRA: the base is synced once, then only
the adapter matrices at every sync) or holds the policy merged (every sync compares and patches the adapted
modules' merged weights, rlhf_cli/rank/engines/delta.py). Decided once, from the run's LoRA keys and the policy's
architecture: the ranks build the engine by it (rlhf_cli/rank/engines/vllm/__init__.py), the plan counts the sync
by it. No torch.

vLLM's LoRA serves the adapters of linear layers only, as PEFT's plain LoRA computes them (x·Aᵀ·Bᵀ·scaling): not
an adapter on the embedding or the LM head, not a module trained whole (`lora_modules_to_save`), not DoRA, not an
adapter on raw parameters (`lora_target_parameters`), and no rank above its largest.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlhf_cli.config.engines.vllm_models import TRANSFORMERS_BACKEND
from rlhf_cli.models.architectures import Architecture, architecture, peft_targets, targeted
from rlhf_cli.models.hub import ModelConfigUnavailable, read_config

# vLLM 0.30's `max_lora_rank` choices (vllm/config/lora.py MaxLoRARanks; tests/test_lora_serving.py compares them
# where vLLM is installed): the engine is built with the smallest that holds the run's rank
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# The causal LMs whose vLLM 0.30 model class declares `SupportsLoRA` (vllm/model_executor/models/registry.py
# `_TEXT_GENERATION_MODELS`; tests/test_lora_serving.py compares the stand-in families' where vLLM is installed): an
# engine built with LoRA for any other stops at its first load ("... does not support LoRA yet"), so vLLM holds
# such a policy merged. GPT-2, GPT-NeoX (Pythia), StableLM, Bloom, Falcon and GPT-J are among those without.
VLLM_LORA_ARCHITECTURES = frozenset({
    "AXK1ForCausalLM", "AfmoeForCausalLM", "ApertusForCausalLM", "ArceeForCausalLM", "BailingMoeForCausalLM",
    "BailingMoeV2ForCausalLM", "ChatGLMForConditionalGeneration", "ChatGLMModel", "Cohere2ForCausalLM",
    "CohereForCausalLM", "CwmForCausalLM", "DeciLMForCausalLM", "DeepseekForCausalLM", "DeepseekV2ForCausalLM",
    "DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM", "Ernie4_5ForCausalLM", "Ernie4_5_MoeForCausalLM",
    "Exaone4ForCausalLM", "ExaoneForCausalLM", "ExaoneMoeForCausalLM", "FalconH1ForCausalLM", "Gemma2ForCausalLM",
    "Gemma3ForCausalLM", "Gemma4ForCausalLM", "GemmaForCausalLM", "Glm4ForCausalLM", "Glm4MoeForCausalLM",
    "Glm4MoeLiteForCausalLM", "GlmForCausalLM", "GlmMoeDsaForCausalLM", "GptOssForCausalLM", "GraniteForCausalLM",
    "GraniteMoeForCausalLM", "GraniteMoeHybridForCausalLM", "GraniteMoeSWAForCausalLM", "GraniteMoeSharedForCausalLM",
    "GraniteSWAForCausalLM", "HYV3ForCausalLM", "HYV4ForCausalLM", "HyperCLOVAXForCausalLM", "IQuestCoderForCausalLM",
    "InklingForCausalLM", "InklingForConditionalGeneration", "InternLM2ForCausalLM", "InternLM3ForCausalLM",
    "Jais2ForCausalLM", "JambaForCausalLM", "K2HorizonForCausalLM", "LLaMAForCausalLM", "LagunaForCausalLM",
    "Lfm2ForCausalLM", "Lfm2MoeForCausalLM", "Llama4ForCausalLM", "LlamaForCausalLM", "LongcatFlashForCausalLM",
    "LongcatFlashNgramForCausalLM", "MellumForCausalLM", "MiMoForCausalLM", "MiniCPM3ForCausalLM",
    "MiniCPMForCausalLM", "MiniMaxM2ForCausalLM", "Ministral3ForCausalLM", "MistralForCausalLM",
    "MistralLarge3ForCausalLM", "MixtralForCausalLM", "NemotronForCausalLM", "NemotronHForCausalLM",
    "NemotronHPuzzleForCausalLM", "OPTForCausalLM", "OlmoHybridForCausalLM", "OlmoeForCausalLM",
    "PanguEmbeddedForCausalLM", "PanguProMoEV2ForCausalLM", "PanguUltraMoEForCausalLM", "Param2MoEForCausalLM",
    "Phi3ForCausalLM", "PhiForCausalLM", "PhiMoEForCausalLM", "Plamo3ForCausalLM", "Qwen2ForCausalLM",
    "Qwen2MoeForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Qwen3NextForCausalLM", "Rnj1ForCausalLM",
    "SarvamMLAForCausalLM", "SarvamMoEForCausalLM", "SeedOssForCausalLM", "SolarForCausalLM", "TeleChat2ForCausalLM",
    "TeleChat3ForCausalLM", "TeleFLMForCausalLM"
})
# Input and output layers' names in the architectures rlhf_cli/models/architectures.py does not lay out
EMBEDDING_NAMES = frozenset({"lm_head", "embed_tokens", "embed_in", "embed_out", "wte", "wpe", "word_embeddings"})


@dataclass(frozen=True)
class LoraServing:
    """vLLM serves the adapters (`max_rank`: the engine's `max_lora_rank`), or holds the policy merged (`reason`)."""

    max_rank: int | None
    reason: str | None = None

    @property
    def served(self) -> bool:
        return self.max_rank is not None


def lora_serving(values: Callable[[str], Any], arch: Architecture | None,
                 model_class: str | None = None) -> LoraServing | None:
    """How a colocated vLLM holds the adapters of a run with `use_peft` (None without): its recipe `values`, the
    policy's architecture (None where not known: its target names are checked) and its config.json's model class
    (`architectures[0]`; None where the config cannot be read: vLLM is taken to serve it)."""
    if not values("use_peft"):
        return None
    reason = _class_reason(model_class) or _merged_reason(values, arch)
    if reason:
        return LoraServing(None, reason)
    rank = values("lora_r")
    return LoraServing(next(allowed for allowed in VLLM_LORA_RANKS if allowed >= rank))


def run_lora_serving(values: Callable[[str], Any], policy: str, revision: str | None, env: Any) -> LoraServing | None:
    """`lora_serving` for the run's `policy` (its config.json read for its architecture; not known where it cannot
    be read), as the ranks, the pre-launch server check and `rlhf vllm-serve` all decide it."""
    try:
        config = read_config(policy, revision, env)
    except ModelConfigUnavailable:
        config = None
    return lora_serving(values, architecture(config) if config else None, model_class_of(config))


def _class_reason(model_class: str | None) -> str | None:
    """Why vLLM's model class of the policy cannot serve LoRA, or None."""
    if model_class is None or model_class in VLLM_LORA_ARCHITECTURES | TRANSFORMERS_BACKEND:
        return None  # the Transformers backend's classes serve LoRA too (through `rlhf vllm-serve`: never colocated)
    return f"vLLM's {model_class} does not support LoRA (no SupportsLoRA); vLLM holds the policy merged"


def model_class_of(config: dict[str, Any] | None) -> str | None:
    """The model class a config.json names (vLLM picks its own by it), or None."""
    classes = (config or {}).get("architectures") or [None]
    return classes[0]


def _merged_reason(values: Callable[[str], Any], arch: Architecture | None) -> str | None:
    """Why vLLM's LoRA cannot serve the run's adapters, or None."""
    if values("use_dora"):
        return "use_dora: vLLM's LoRA has no DoRA; vLLM holds the policy merged"
    if values("lora_modules_to_save"):
        return "lora_modules_to_save trains modules whole; vLLM holds the policy merged"
    if values("lora_target_parameters"):
        return "lora_target_parameters adapts raw parameters, which vLLM's LoRA does not; vLLM holds the policy merged"
    if values("lora_r") > VLLM_LORA_RANKS[-1]:
        return (f"lora_r {values('lora_r')} is above vLLM's largest LoRA rank ({VLLM_LORA_RANKS[-1]}); vLLM holds "
                "the policy merged")
    targets = peft_targets(values("lora_target_modules"))
    embedded = _embedding_targets(arch, targets)
    if embedded:
        return (f"lora_target_modules adapts {', '.join(embedded)}: vLLM's LoRA serves no embedding or LM head; "
                "vLLM holds the policy merged")
    return None


def _embedding_targets(arch: Architecture | None, targets: str | list[str] | None) -> list[str]:
    """The embeddings or output layer among the modules `targets` selects (PEFT's default targets never do)."""
    if targets is None:
        return []
    if arch is not None:
        return sorted({module.path for module, _ in targeted(arch, targets)
                       if module.embedding or module.path == arch.output_layer})
    names = [targets] if isinstance(targets, str) else targets
    return sorted({name for name in names if name.rsplit(".", 1)[-1] in EMBEDDING_NAMES})
