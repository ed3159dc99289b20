"""`--vllm` and TRL's vLLM keys in resolution: the flags set TRL's keys with a flag's precedence, every training
command and `rlhf plan` take them, and the plan (which may plan for another machine) does not ask for vLLM here.
Refusals are in tests/test_bad_inputs.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import RECIPES

COMMANDS = ("ppo", "rloo", "grpo", "online-dpo")


@pytest.fixture
def vllm_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM 0.30.0 as package metadata shows it (the CLI never imports vLLM)."""
    metadata = tmp_path / "site" / "vllm-0.30.0.dist-info" / "METADATA"
    metadata.parent.mkdir(parents=True)
    metadata.write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.30.0\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))


def _trainer(cli, command: str, *args: str) -> dict:
    name = command.replace("-", "_")
    result = cli(command, "-r", f"{name}/smoke", *args, "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.output[result.output.index("{"):])["trainer"]


@pytest.mark.parametrize("command", COMMANDS)
def test_vllm_flag_sets_trls_keys(cli, vllm_installed, monkeypatch, command: str) -> None:
    monkeypatch.setattr("rlhf_cli.config.resolve.cuda_present", lambda: False)  # every trainer serves from a CPU
    trainer = _trainer(cli, command, "--vllm", "server", "--set", "vllm_server_port=8123")
    assert trainer["use_vllm"] is True and trainer["vllm_mode"] == "server"
    assert trainer["vllm_server_port"] == 8123


def test_no_vllm_beats_the_recipes_use_vllm(cli, vllm_installed, tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text((RECIPES / "grpo" / "smoke.yaml").read_text().replace("../smoke", str(RECIPES / "smoke"))
                      + "use_vllm: true\nvllm_mode: colocate\n")
    result = cli("grpo", "-r", str(recipe), "--no-vllm", "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output[result.output.index("{"):])["trainer"]["use_vllm"] is False
    result = cli("grpo", "-r", str(recipe), "--dry-run", "--json")
    assert json.loads(result.output[result.output.index("{"):])["trainer"]["use_vllm"] is True


def test_the_plan_takes_vllm_without_vllm_installed_here(cli) -> None:
    # planned for a GPU machine from one without vLLM (or without a GPU: sleep mode is that machine's business)
    result = cli("plan", "grpo", "-r", "grpo/smoke", "--vllm", "colocate", "--set", "vllm_enable_sleep_mode=true")
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("command", (*COMMANDS, "plan"))
def test_every_training_command_and_the_plan_list_the_vllm_flags(cli, command: str) -> None:
    result = cli(command, "--help") if command != "plan" else cli("plan", "grpo", "--help")
    text = " ".join(result.output.split())
    assert "--vllm" in text and "--no-vllm" in text


@pytest.mark.parametrize(("setting", "module"), [
    ("lora_target_modules=[q_proj, embed_tokens]", "model.embed_tokens"),
    ("lora_modules_to_save=[lm_head]", "lm_head"),
])
def test_a_tied_models_head_or_embedding_is_not_adapted_under_vllm(cli, vllm_installed, family_models,
                                                                   setting: str, module: str) -> None:
    """vLLM holds a tied embedding and LM head as one matrix (Qwen2.5: tie_word_embeddings true)."""
    args = ("grpo", "-r", "grpo/smoke", "--model", str(family_models["qwen2.5"]), "--lora", "--set", setting,
            "--dry-run")
    result = cli(*args, "--vllm", "colocate")
    assert result.exit_code == 2 and f"adapts `{module}` of " in result.output and "are tied" in result.output, \
        result.output
    assert len(result.output.strip().splitlines()) == 1
    assert cli(*args).exit_code == 0  # generate() holds the policy itself: nothing to refuse
    untied = cli("grpo", "-r", "grpo/smoke", "--lora", "--set", "lora_target_modules=[q_proj, embed_tokens]",
                 "--vllm", "colocate", "--dry-run")
    assert untied.exit_code == 0, untied.output


@pytest.mark.parametrize(("family", "architecture"), [("olmo2", "Olmo2ForCausalLM"),
                                                      ("smollm3", "SmolLM3ForCausalLM")])
def test_a_colocated_engine_on_vllms_transformers_backend_is_refused_before_launch(cli, vllm_installed, family: str,
                                                                                  architecture: str,
                                                                                  tmp_path: Path) -> None:
    """vLLM 0.30 runs OLMo-2 and SmolLM3 on its Transformers backend only, which rebuilds the trainer's own class
    (under ZeRO-3: "Cannot copy out of meta tensor"): refused in one line, as `vllm_model_impl: transformers` is."""
    from families.build import build_family

    model = build_family(family, tmp_path / family, vllm=True)
    args = ("grpo", "-r", "grpo/smoke", "--model", str(model), "--set", f"reward_model_name_or_path={model}",
            "--dry-run")
    refused = cli(*args, "--vllm", "colocate")
    lines = refused.output.strip().splitlines()
    assert refused.exit_code == 2 and len(lines) == 1, refused.output
    assert f"--vllm colocate: vLLM 0.30 runs {model} ({architecture}) on its Transformers backend only" in lines[0]
    assert "--vllm server or without --vllm" in lines[0]
    assert cli(*args).exit_code == 0  # generate() runs the policy itself
    chosen = cli("grpo", "-r", "grpo/smoke", "--vllm", "colocate", "--set", "vllm_model_impl=transformers",
                 "--dry-run")
    assert chosen.exit_code == 2 and "`vllm_model_impl: transformers`" in chosen.output, chosen.output


def test_the_transformers_backend_table_is_vllms_registry() -> None:
    pytest.importorskip("vllm")
    from vllm.model_executor.models.registry import _TRANSFORMERS_SUPPORTED_MODELS

    from rlhf_cli.config.engines.vllm import TRANSFORMERS_BACKEND

    causal = {name for name, (_, implementation) in _TRANSFORMERS_SUPPORTED_MODELS.items()
              if implementation in ("TransformersForCausalLM", "TransformersMoEForCausalLM")}
    assert TRANSFORMERS_BACKEND == causal
