"""Whether a LoRA run's colocated vLLM serves the adapters itself (rlhf_cli/config/engines/vllm_lora.py): decided
once from the run's LoRA keys and the policy's architecture, without torch; and what TRL's `LLM(...)` is built
with for it (rlhf_cli/rank/engines/vllm/adapters.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from helpers import MODEL_CONFIGS, needs_vllm
from rlhf_cli.config.engines.vllm_lora import (
    VLLM_LORA_ARCHITECTURES,
    VLLM_LORA_RANKS,
    LoraServing,
    lora_serving,
    model_class_of,
)
from rlhf_cli.models.architectures import architecture

DEFAULTS = {"use_peft": True, "lora_r": 16, "lora_target_modules": None, "lora_modules_to_save": None,
            "use_dora": False, "lora_target_parameters": None}


# The model classes of the families tests/families/build.py stands in for, and of Phi-3, Gemma-2/3 and Qwen3
FAMILY_CLASSES = ("GPTNeoXForCausalLM", "GPT2LMHeadModel", "LlamaForCausalLM", "Qwen2ForCausalLM",
                  "MistralForCausalLM", "GemmaForCausalLM", "GraniteForCausalLM", "CohereForCausalLM",
                  "StableLmForCausalLM", "Qwen3ForCausalLM", "Phi3ForCausalLM", "Gemma2ForCausalLM",
                  "Gemma3ForCausalLM")


def _serving(arch: Any = None, model_class: str | None = None, **values: Any) -> LoraServing | None:
    return lora_serving({**DEFAULTS, **values}.__getitem__, arch, model_class)


def _llama() -> Any:
    return architecture(json.loads((MODEL_CONFIGS / "llama-3.1-8b" / "config.json").read_text()))


@pytest.mark.parametrize(("rank", "engine_rank"), [(1, 1), (4, 8), (8, 8), (16, 16), (33, 64), (300, 320),
                                                   (512, 512)])
def test_plain_lora_is_served_with_the_smallest_vllm_rank_that_holds_it(rank: int, engine_rank: int) -> None:
    served = _serving(_llama(), lora_r=rank, lora_target_modules=["q_proj", "v_proj"])
    assert served == LoraServing(engine_rank) and served.served and served.reason is None


@pytest.mark.parametrize(("values", "said"), [
    ({"use_peft": False}, None),
    ({"use_dora": True}, "use_dora"),
    ({"lora_modules_to_save": ["lm_head"]}, "lora_modules_to_save"),
    ({"lora_target_parameters": ["mlp.experts.gate_up_proj"]}, "lora_target_parameters"),
    ({"lora_r": 513}, "above vLLM's largest LoRA rank (512)"),
    ({"lora_target_modules": ["q_proj", "lm_head"]}, "adapts lm_head: vLLM's LoRA serves no embedding or LM head"),
    ({"lora_target_modules": ["embed_tokens"]}, "adapts model.embed_tokens"),
    ({"lora_target_modules": [r".*\.(embed_tokens|q_proj)"]}, "adapts model.embed_tokens"),
], ids=["no-lora", "dora", "modules-to-save", "target-parameters", "rank", "head", "embedding", "pattern"])
def test_what_vllms_lora_cannot_serve_is_held_merged_and_says_why(values: dict[str, Any], said: str | None) -> None:
    served = _serving(_llama(), **values)
    if said is None:
        assert served is None
        return
    assert not served.served and said in served.reason and "vLLM holds the policy merged" in served.reason


def test_peft_defaults_and_all_linear_are_served_and_an_unknown_architecture_is_judged_by_its_names() -> None:
    assert _serving(_llama()).served  # PEFT's q_proj, v_proj
    assert _serving(_llama(), lora_target_modules=["all-linear"]).served  # never the output layer
    assert _serving(None, lora_target_modules=["c_attn", "c_proj"]).served
    assert not _serving(None, lora_target_modules=["c_attn", "wte"]).served
    assert _serving(None, lora_target_modules=[r".*attn.*"]).served  # a pattern: the ranks' model decides


@pytest.mark.parametrize("model_class", ["GPTNeoXForCausalLM", "GPT2LMHeadModel", "StableLmForCausalLM"])
def test_a_policy_whose_vllm_class_has_no_lora_is_held_merged_before_launch(model_class: str) -> None:
    """vLLM's GPT-NeoX (Pythia), GPT-2 and StableLM classes declare no SupportsLoRA: an engine built with LoRA
    stops at its first load, so the run trains with merged syncs, whatever its targets."""
    config = {**json.loads((MODEL_CONFIGS / "pythia-70m" / "config.json").read_text()), "architectures": [model_class]}
    served = _serving(architecture(config), model_class_of(config))
    assert not served.served and f"vLLM's {model_class} does not support LoRA" in served.reason
    assert _serving(None, model_class, lora_target_modules=["q_proj", "v_proj"]).reason == served.reason
    assert _serving(_llama(), model_class_of({"architectures": ["GraniteForCausalLM"]})).served
    assert _serving(_llama(), model_class_of({})).served  # no class named: vLLM picks by the checkpoint


def test_the_ranks_read_the_policys_model_class_from_its_config(tmp_path) -> None:
    from rlhf_cli.rank.engines.vllm import run_lora_serving

    class Inputs:
        value = {**DEFAULTS, "env": None}.__getitem__

        def __init__(self, path: str) -> None:
            self.model_value = {"model_name_or_path": path, "model_revision": None}.__getitem__

    assert not run_lora_serving(Inputs(str(MODEL_CONFIGS / "pythia-70m"))).served
    assert run_lora_serving(Inputs(str(MODEL_CONFIGS / "llama-3.1-8b"))).served
    assert run_lora_serving(Inputs("org/not-cached")).served  # unread: vLLM is taken to serve it


@needs_vllm
def test_the_model_classes_served_with_lora_are_those_declaring_supports_lora() -> None:
    from vllm.model_executor.models.interfaces import supports_lora
    from vllm.model_executor.models.registry import _TEXT_GENERATION_MODELS, ModelRegistry

    assert VLLM_LORA_ARCHITECTURES <= set(_TEXT_GENERATION_MODELS)
    for name in FAMILY_CLASSES:
        assert supports_lora(ModelRegistry._try_load_model_cls(name)) == (name in VLLM_LORA_ARCHITECTURES), name


def test_the_engine_is_built_with_vllms_lora_only_when_it_serves_the_adapters() -> None:
    from rlhf_cli.rank.engines.vllm.adapters import engine_arguments

    assert engine_arguments(LoraServing(16)) == {"enable_lora": True, "max_lora_rank": 16, "max_loras": 1}
    assert engine_arguments(LoraServing(None, "use_dora")) == {} == engine_arguments(None)


@needs_vllm
def test_the_ranks_offered_are_vllms() -> None:
    from typing import get_args

    from vllm.config.lora import MaxLoRARanks

    assert VLLM_LORA_RANKS == get_args(MaxLoRARanks)


class Engine:
    """What TRL, PPO's rollouts and the self-check call on a `vllm.LLM`: they never pass a LoRA themselves."""

    def generate(self, prompts: Any, sampling_params: Any = None, **kwargs: Any) -> dict[str, Any]:
        return kwargs

    def chat(self, messages: Any, sampling_params: Any = None, **kwargs: Any) -> dict[str, Any]:
        return kwargs


def test_every_generation_of_an_engine_serving_the_adapters_passes_the_current_lora(tmp_path) -> None:
    from rlhf_cli.rank.engines.vllm.adapters import serve_lora

    llm = Engine()
    serve_lora(llm, LoraServing(16), str(tmp_path))
    assert llm.generate(["p"], "greedy") == {} and llm.rlhf_lora_reason is None  # before the first sync: the base
    llm.rlhf_lora.request = "the LoRA of sync 2"
    assert llm.generate(["p"], "greedy", use_tqdm=False) == {"use_tqdm": False, "lora_request": "the LoRA of sync 2"}
    assert llm.chat([], "greedy")["lora_request"] == "the LoRA of sync 2"
    assert llm.rlhf_lora.directory.parent == tmp_path / "vllm-lora" and llm.rlhf_lora.max_rank == 16
    merged = Engine()
    serve_lora(merged, LoraServing(None, "use_dora: ..."), str(tmp_path))
    assert not hasattr(merged, "rlhf_lora") and merged.rlhf_lora_reason == "use_dora: ..."
