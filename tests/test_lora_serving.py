"""Whether a LoRA run's colocated vLLM serves the adapters itself (rlhf_cli/config/engines/vllm_lora.py): decided
once from the run's LoRA keys and the policy's architecture, without torch; and what TRL's `LLM(...)` is built
with for it (rlhf_cli/rank/engines/vllm/adapters.py)."""

from __future__ import annotations

import json
from pathlib import Path
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
    assert _serving(None, "Olmo2ForCausalLM", lora_target_modules=["all-linear"]).served  # Transformers backend


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
    assert supports_lora(ModelRegistry._try_load_model_cls("TransformersForCausalLM"))  # OLMo-2, SmolLM3, ...
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


class Reply:
    def __init__(self, status: int, body: Any = None) -> None:
        self.status_code, self.body = status, body
        self.text = json.dumps(body) if body is not None else ""
        self.content = self.text.encode()

    def json(self) -> Any:
        return self.body


class Server:
    """What a run's ranks ask of `rlhf vllm-serve` over HTTP (TRL's VLLMClient and its session): the requests it
    got, and its replies by route."""

    def __init__(self, lora_config: Any, replies: dict[str, Reply] | None = None) -> None:
        self.base_url, self.model, self.session = "http://server", "the/policy", self
        self.lora_config, self.replies, self.posted = lora_config, replies or {}, []

    def get_server_info(self) -> dict[str, Any]:
        return {"lora_config": self.lora_config}

    def post(self, url: str, json: Any = None) -> Reply:
        route = url.removeprefix(self.base_url + "/")
        self.posted.append((route, json))
        return self.replies.get(route, Reply(200))


@pytest.fixture
def served_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run whose LoRA of rank 16 vLLM serves (set when the ranks install vLLM)."""
    from rlhf_cli.rank.engines.vllm.server import ServerTarget

    monkeypatch.setattr(ServerTarget, "lora", LoraServing(16))


def test_a_server_serving_the_runs_lora_loads_each_syncs_adapter_under_its_models_name(tmp_path, served_run) -> None:
    """TRL's client names the server's model, never a LoRA: the adapter is loaded in place under that name, from a
    PEFT-format adapter in the run's directory, and the checksums the server's worker reports are read back."""
    import torch
    from safetensors.torch import load_file

    from rlhf_cli.rank.engines.adapters import PackedAdapters
    from rlhf_cli.rank.engines.vllm.server import ServerTarget
    from rlhf_cli.rank.engines.vllm.worker_extension import LORA_CHECKSUM_METHOD

    sums = {"model.layers.0.self_attn.qkv_proj.lora_a0": [3, -5]}
    server = Server({"max_lora_rank": 16}, {"collective_rpc": Reply(200, {"results": [sums]})})
    target = ServerTarget(server, None, tmp_path / "run" / "vllm-weights")
    assert target.adapters.max_rank == 16 and target.lora_reason is None
    tensors = {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.arange(6.0).reshape(2, 3)}
    target.adapters.load(PackedAdapters(tensors, {"peft_type": "LORA", "r": 2, "lora_alpha": 2}, {}, 0))
    route, body = server.posted[-1]
    assert route == "v1/load_lora_adapter" and body["lora_name"] == "the/policy" and body["load_inplace"] is True
    assert body["lora_path"] == str((tmp_path / "run" / "vllm-lora" / "server").resolve())
    assert torch.equal(load_file(f"{body['lora_path']}/adapter_model.safetensors")[next(iter(tensors))],
                       next(iter(tensors.values())))
    assert json.loads((tmp_path / "run" / "vllm-lora" / "server" / "adapter_config.json").read_text())["r"] == 2
    assert target.adapters.checksums() == {"model.layers.0.self_attn.qkv_proj.lora_a0": (3, -5)}
    assert server.posted[-1] == ("collective_rpc", {"method": LORA_CHECKSUM_METHOD})
    server.replies["collective_rpc"] = Reply(200, {"results": [sums, sums]})  # tensor parallel: slices, unchecked
    assert target.adapters.checksums() is None
    server.replies["v1/load_lora_adapter"] = Reply(404, {"detail": "Not Found"})  # no runtime LoRA loading
    with pytest.raises(RuntimeError, match="did not load the run's LoRA .* --lora"):
        target.adapters.load(PackedAdapters(tensors, {}, {}, 0))


def test_a_server_started_without_lora_is_refused_and_a_dense_reload_drops_the_served_lora(tmp_path,
                                                                                            served_run) -> None:
    import torch

    from rlhf_cli.rank.engines.vllm.server import ServerTarget

    for lora_config, said in ((None, "started without LoRA"), ({"max_lora_rank": 8}, "up to rank 8")):
        with pytest.raises(RuntimeError, match=said):
            ServerTarget(Server(lora_config), None, tmp_path / "vllm-weights")
    server = Server({"max_lora_rank": 16}, {"v1/unload_lora_adapter": Reply(404)})  # none loaded yet: fine
    ServerTarget(server, None, tmp_path / "vllm-weights").load(iter([("w", torch.ones(2))]))
    assert [route for route, _ in server.posted] == ["collective_rpc", "v1/unload_lora_adapter"]
    assert server.posted[-1][1] == {"lora_name": "the/policy"}
    server.replies["v1/unload_lora_adapter"] = Reply(500)
    with pytest.raises(RuntimeError, match="did not drop the LoRA"):
        ServerTarget(server, None, tmp_path / "vllm-weights").load(iter([("w", torch.ones(2))]))


@needs_vllm
def test_vllms_server_serves_a_request_naming_its_model_with_a_lora_loaded_under_that_name() -> None:
    """What a server serving the run's LoRA relies on (rlhf_cli/compat/vllm_lora.py): TRL's client names the
    model, and a LoRA loaded under that name serves it; without one, the base."""
    from types import SimpleNamespace

    from vllm.entrypoints.serve.engine.serving import BaseServing

    loaded = SimpleNamespace(lora_name="the/policy", lora_int_id=3)
    serving = SimpleNamespace(models=SimpleNamespace(lora_requests={"the/policy": loaded},
                                                     is_base_model=lambda name: name == "the/policy"),
                              _is_model_supported=lambda name: name == "the/policy")
    assert BaseServing._maybe_get_adapters(serving, SimpleNamespace(model="the/policy")) is loaded
    serving.models.lora_requests = {}
    assert BaseServing._maybe_get_adapters(serving, SimpleNamespace(model="the/policy")) is None


@pytest.mark.parametrize("server", [False, True], ids=["colocated", "server"])
def test_a_finished_run_removes_what_its_syncs_left_but_the_adapter_a_server_serves(server: bool,
                                                                                   tmp_path: Path) -> None:
    """The server's whole weight copy and the colocated ranks' adapters go; a server's adapter stays (vLLM reads
    it again when its LoRA cache drops it); the run's own files are not touched."""
    from rlhf_cli.rank.engines.vllm import remove_transfers

    for name in ("vllm-weights/weights-00000.safetensors", "vllm-lora/rank-0/sync-3/adapter_config.json",
                 "vllm-lora/rank-1/sync-3/adapter_config.json", "model.safetensors", "ranks/rank-0.json",
                 *(["vllm-lora/server/adapter_config.json"] if server else [])):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("{}")
    remove_transfers(tmp_path)
    left = sorted(str(path.relative_to(tmp_path)) for path in tmp_path.rglob("*") if path.is_file())
    assert left == ["model.safetensors", "ranks/rank-0.json", *(["vllm-lora/server/adapter_config.json"] if server
                                                                 else [])]
    assert (tmp_path / "vllm-lora").exists() == server
