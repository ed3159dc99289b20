"""PPO's vLLM rollouts without vLLM: prompts and responses as `generate` has them, the server-mode weight files,
and the server command `rlhf vllm-serve` starts."""

from __future__ import annotations

import importlib
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from helpers import RECIPES
from rlhf_cli.cli.vllm_serve import WORKER_EXTENSION
from rlhf_cli.rank.engines.vllm.ppo_rollouts import padded, prompt_ids, sampled_logprobs, sampling_settings
from rlhf_cli.rank.engines.vllm.server import write_weight_files

PAD = 0


def test_prompts_lose_their_left_padding_and_responses_are_right_padded() -> None:
    queries = torch.tensor([[PAD, PAD, 5, 6], [7, 8, 9, 10]])
    assert prompt_ids(queries, PAD) == [[5, 6], [7, 8, 9, 10]]
    # pad is EOS for pythia, GPT-2, Qwen: inside a prompt it is a real token
    assert prompt_ids(torch.tensor([[PAD, 5, PAD, 6], [7, PAD, PAD, 8]]), PAD) == [[5, PAD, 6], [7, PAD, PAD, 8]]
    cpu = torch.device("cpu")
    responses = padded([[3, 2], [4, 4, 4]], PAD, torch.long, cpu)
    assert responses.tolist() == [[3, 2, PAD], [4, 4, 4]]
    assert padded([[], []], PAD, torch.long, cpu).tolist() == [[PAD], [PAD]]
    # TRL's logprobs=0 nesting: one list per token, the sampled token's log-prob first; None where vLLM had none
    logprobs = padded(sampled_logprobs([[[-0.5], [-1.0]], [[None], [-2.0], [-0.25]]]), 0.0, torch.float32, cpu)
    assert logprobs[0].tolist() == [-0.5, -1.0, 0.0] and logprobs[1, 0].isnan() and logprobs[1, 1:].tolist() == \
        [-2.0, -0.25]


def test_sampling_matches_generate_and_stops_only_at_the_stop_token() -> None:
    with_stop = sampling_settings(12, 0.7, stop_token_id=2)
    assert with_stop["max_completion_length"] == 12 and with_stop["top_k"] == 0 and with_stop["top_p"] == 1.0
    assert with_stop["temperature"] == pytest.approx(0.7 + 1e-7)  # as rollout_generation_config
    assert with_stop["generation_kwargs"] == {"ignore_eos": True, "stop_token_ids": [2]}
    assert sampling_settings(12, 0.7, stop_token_id=None)["generation_kwargs"]["stop_token_ids"] is None


def test_server_weights_are_written_as_they_arrive_in_files_of_bounded_size(tmp_path: Path) -> None:
    """The server-mode sync's files (rlhf_cli/rank/engines/vllm/server.py): every weight once, under its own name, each
    copied as it arrives (the tensor handed over is changed right after, as a released bucket would be)."""
    from safetensors.torch import load_file

    policy = AutoModelForCausalLM.from_pretrained(RECIPES / "smoke" / "policy")
    state = {name: tensor.clone() for name, tensor in policy.state_dict().items()}

    def released_after_reading():
        for name, tensor in policy.state_dict().items():
            yield name, tensor
            tensor.zero_()

    largest = max(t.numel() * t.element_size() for t in state.values())
    stale = tmp_path / "weights" / "stale.safetensors"
    stale.parent.mkdir()
    stale.write_bytes(b"old")
    files = write_weight_files(tmp_path / "weights", released_after_reading(), flush_bytes=largest)
    assert sorted(tmp_path.joinpath("weights").iterdir()) == files and len(files) > 1
    loaded = {name: tensor for path in files for name, tensor in load_file(path).items()}
    assert loaded.keys() == state.keys() and all(loaded[name].equal(state[name]) for name in state)


def test_a_bucket_of_patches_reaches_the_server_as_written(tmp_path: Path) -> None:
    """The delta sync's transport to a server: names, shapes, bf16 values and flat indices (int32, or none for a
    whole tensor) come back from the file as sent, in order."""
    import torch

    from rlhf_cli.rank.engines.vllm.patch_files import read_patch_file, write_patch_file
    from rlhf_cli.rank.engines.weights import Patch

    sparse = Patch("model.layers.0.mlp.down_proj.weight", (8, 4), torch.randn(3).to(torch.bfloat16),
                   torch.tensor([0, 17, 31], dtype=torch.int32))
    whole = Patch("model.norm.weight", (4,), torch.randn(4).to(torch.bfloat16))
    path = write_patch_file(tmp_path / "weights" / "patches.safetensors", [sparse, whole])
    read = read_patch_file(path)
    assert [(name, shape) for name, shape, _, _ in read] == [(sparse.name, (8, 4)), (whole.name, (4,))]
    assert torch.equal(read[0][2], sparse.values) and read[0][2].dtype == torch.bfloat16
    assert read[0][3].tolist() == [0, 17, 31] and read[1][3].tolist() == [0, 1, 2, 3]
    assert torch.equal(read[1][2], whole.values)


def test_vllm_serve_starts_the_runs_model_on_loopback_with_its_settings() -> None:
    done = subprocess.run([sys.executable, "-m", "rlhf_cli", "vllm-serve", "ppo", "-r", "ppo/smoke", "--dry-run",
                           "--set", "vllm_server_port=8123", "--set", "vllm_max_model_length=64", "--set", "seed=7"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    argv = shlex.split(done.stdout.strip())
    assert argv[2] == "vllm.entrypoints.openai.api_server"  # the working directory last on its import path
    options = dict(zip(argv[3::2], argv[4::2], strict=True))
    assert options["--model"] == str(RECIPES / "smoke" / "policy")
    assert options["--dtype"] == "float32"  # the checkpoint's, as the trainer holds it: not vLLM's auto (bf16)
    # logprobs of the sampling distribution (temperature applied), as PPO's importance sampling compares them
    assert options["--logprobs-mode"] == "processed_logprobs"
    assert (options["--host"], options["--port"], options["--max-model-len"], options["--seed"]) == \
        ("127.0.0.1", "8123", "64", "7")
    # the weight refresh reloads through rlhf's worker method, tied layers re-processed after
    module, _, name = options["--worker-extension-cls"].rpartition(".")
    from rlhf_cli.rank.engines.vllm.worker_extension import RELOAD_METHOD

    assert hasattr(getattr(importlib.import_module(module), name), RELOAD_METHOD)


@pytest.mark.parametrize("command", ["rloo", "grpo", "online-dpo"])
def test_vllm_serve_serves_trls_trainers_as_it_serves_ppo(command: str) -> None:
    """RLOO, GRPO and online DPO sync the server through rlhf's directory sync, as PPO does: the same server, with
    the worker extension that reloads the directory."""
    name = command.replace("-", "_")
    done = subprocess.run([sys.executable, "-m", "rlhf_cli", "vllm-serve", command, "-r", f"{name}/smoke",
                           "--dry-run", "--set", "vllm_server_port=8123"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    argv = shlex.split(done.stdout.strip().splitlines()[-1])
    options = dict(zip(argv[3::2], argv[4::2], strict=True))
    assert argv[2] == "vllm.entrypoints.openai.api_server"
    assert options["--model"] == str(RECIPES / "smoke" / "policy") and options["--port"] == "8123"
    assert options["--worker-extension-cls"] == WORKER_EXTENSION and options["--dtype"] == "float32"


def test_vllm_serve_checks_its_own_port_and_host_before_starting_vllm(cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """A port vLLM cannot listen on is one line at once, not a vLLM traceback after the model loaded; port 0 is
    not taken for the run's own port."""
    import os
    import socket

    started = []
    monkeypatch.setattr(os, "execve", lambda *args: started.append(args))
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    try:
        for args, said in ((("--port", "0"), "--port 0: give the port the run's ranks will use (1 to 65535)"),
                           (("--port", "99999"), "--port 99999: give the port"),
                           (("--host", "no host!"), "--host 'no host!' is neither an IP address nor a host name"),
                           (("--set", f"vllm_server_port={port}"), f"127.0.0.1:{port} is in use; stop what listens "
                            "there, or pass another `vllm_server_port`")):
            result = cli("vllm-serve", "ppo", "-r", "ppo/smoke", *args)
            lines = [line for line in result.output.splitlines() if line.strip()]
            assert result.exit_code == 2 and len(lines) == 1, result.output
            assert said in " ".join(lines[0].split())
    finally:
        busy.close()
    assert started == []


@pytest.mark.parametrize("delta", [True, False])
def test_ppo_syncs_its_vllm_as_weight_sync_delta_says(delta: bool, monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    """PPO's rollouts reach the weight sync outside TRL's hooks: the recipe's `weight_sync_delta` goes with them."""
    from types import SimpleNamespace

    from rlhf_cli.generation.choice import Engine, Gather, Generation
    from rlhf_cli.rank.engines.vllm import ppo_rollouts
    from rlhf_cli.rank.ppo.rollouts import rollouts_for

    synced = []
    monkeypatch.setattr(ppo_rollouts, "sync_weights", lambda model, target, limit, woke=False, delta=True: (
        synced.append((target, delta)) or {"seconds": 0.0, "peak_bytes": 0}))
    args = SimpleNamespace(output_dir=str(tmp_path), response_length=4, temperature=0.7, vllm_enable_sleep_mode=False)
    trainer = SimpleNamespace(args=args, accelerator=SimpleNamespace(is_main_process=False,
                                                                    wait_for_everyone=lambda: None),
                              policy_and_value=SimpleNamespace(policy=torch.nn.Linear(2, 2)),
                              processing_class=SimpleNamespace(pad_token_id=PAD), stop_token_id=None)
    rollouts = rollouts_for(trainer, Generation(Gather.whole, Engine.server), 0, delta)
    rollouts.start(resumed=False)  # a server gets this run's weights before its first rollout
    rollouts.sync()
    assert [(target is rollouts.server, sent) for target, sent in synced] == [(True, delta)] * 2


def test_vllm_serve_turns_on_vllms_lora_for_a_run_whose_adapters_it_serves() -> None:
    """`--lora` (or the recipe's `use_peft`), as the run says it: vLLM's LoRA, one adapter, at the smallest vLLM
    rank holding the run's; a LoRA vLLM cannot serve (DoRA) starts it without, saying why."""
    def started(*flags: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "rlhf_cli", "vllm-serve", "grpo", "-r", "grpo/smoke", "--dry-run",
                               *flags], capture_output=True, text=True, timeout=120)

    for flags, rank in ((("--lora",), "16"), (("--lora", "--lora-r", "4"), "8"), (("--set", "use_peft=true"), "16")):
        done = started(*flags)
        assert done.returncode == 0, done.stderr
        argv = shlex.split(done.stdout.strip().splitlines()[-1])
        assert argv[argv.index("--enable-lora") + 1:argv.index("--enable-lora") + 5] == \
            ["--max-lora-rank", rank, "--max-loras", "1"], argv
    done = started("--lora", "--set", "use_dora=true")
    assert done.returncode == 0 and "--enable-lora" not in done.stdout and "use_dora" in done.stderr
    assert "--enable-lora" not in started().stdout
    done = started("--lora", "--no-lora")
    assert done.returncode == 2 and "--lora and --no-lora contradict each other" in done.stderr
