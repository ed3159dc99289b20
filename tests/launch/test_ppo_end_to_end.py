"""`rlhf ppo` really launched: 2 ranks under DeepSpeed ZeRO-3 on the CPU: learning (with and without LoRA), resume,
offload and vLLM rollouts. Gather against no-gather: tests/launch/test_gather_budget_end_to_end.py; every model
family: tests/launch/test_conformance.py."""

from __future__ import annotations

import itertools
import json
import subprocess
from pathlib import Path

import pytest

from helpers import (
    FIXTURES,
    PPO_METRICS,
    RECIPES,
    SMALL_BUCKETS,
    VLLM_ENV,
    launch_rlhf,
    needs_vllm,
    served_and_saved_logprobs,
    sets,
)

LEARNABLE = ("reward_model_name_or_path=null", f"reward_funcs=[{FIXTURES}/rewards.py:letter_e]",
             "total_episodes=160", "learning_rate=1e-2", "temperature=1.0", "missing_eos_penalty=null",
             "num_ppo_epochs=4", "kl_coef=0.0")


def ppo(out: Path, *args: str, pairs: tuple[str, ...] = SMALL_BUCKETS, env: dict[str, str] | None = None,
        timeout: float = 480) -> subprocess.CompletedProcess:
    done = launch_rlhf("ppo", out, *args, *sets(*pairs), env={"RLHF_PROBE_GENERATION": "1", **(env or {})},
                       timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return done


def logged(out: Path) -> list[dict]:
    return [entry for entry in json.loads((out / "trainer_state.json").read_text())["log_history"]
            if "objective/scores" in entry]


def test_score_rises_on_a_learnable_reward(tmp_path: Path) -> None:
    """The mean score of the last 3 of 20 updates went 0.079 -> 0.287 (rank correlation with the step 0.76);
    with learning_rate 0, 0.079 -> 0.061 (correlation -0.14). (With one seed on both ranks it was 0.084 -> 0.241,
    0.74; control 0.079 -> 0.070, -0.06.) The test asks for a trend no chance walk gives: a rise of 0.05 (3 sigma
    of the mean of 3 when nothing is learned) and a Kendall rank correlation with the step above 0.4 (2.5 sigma
    for 20 unrelated scores)."""
    ppo(tmp_path / "run", "--no-gather", pairs=LEARNABLE)
    scores = [entry["objective/scores"] for entry in logged(tmp_path / "run")]
    assert len(scores) == 20
    first, last = sum(scores[:3]) / 3, sum(scores[-3:]) / 3
    pairs = list(itertools.combinations(range(len(scores)), 2))
    tau = sum((scores[j] > scores[i]) - (scores[j] < scores[i]) for i, j in pairs) / len(pairs)
    assert last > first + 0.05 and tau > 0.4, (tau, scores)


# The optimizer and the parameters offloaded to the CPU, from a user's accelerate config that leaves
# zero3_save_16bit_model false (accelerate's default); no gather.
OFFLOADED = ("--no-gather", "--offload-optimizer", "cpu", "--offload-params", "cpu")


@pytest.fixture(scope="module")
def offloaded_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, tuple[str, ...]]:
    """One offloaded run of 4 updates saving every 2, which the offload test reads and the resume test resumes:
    (its output dir, the flags a run of the same layout takes)."""
    work = tmp_path_factory.mktemp("offloaded")
    config = work / "accelerate.yaml"
    config.write_text("distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n  zero_stage: 3\n"
                      "  zero3_init_flag: true\n")
    layout = (*OFFLOADED, "--accelerate-config", str(config))
    ppo(work / "run", *layout, "--set", "save_strategy=steps", "--set", "save_steps=2")
    return work / "run", layout


@pytest.mark.xdist_group("ppo-offloaded-run")  # one module-scoped run, one worker
def test_checkpoint_loads_and_resume_continues_episodes_and_schedule(offloaded_run: tuple[Path, tuple[str, ...]],
                                                                     tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    out, layout = offloaded_run
    full = logged(out)
    checkpoint = out / "checkpoint-2"
    assert AutoModelForCausalLM.from_pretrained(checkpoint).num_parameters() > 0

    resumed_dir = tmp_path / "resumed"
    done = ppo(resumed_dir, *layout, "--resume", str(checkpoint))
    resumed = logged(resumed_dir)
    assert [entry["step"] for entry in resumed] == [1, 2, 3, 4]  # the first two come from the checkpoint
    assert [entry["episode"] for entry in resumed[2:]] == [24, 32]
    assert [entry["lr"] for entry in resumed[2:]] == [entry["lr"] for entry in full[2:]]
    # Weights, optimizer, schedule, RNG and data position all came back: the same updates follow.
    assert [e["objective/scores"] for e in resumed[2:]] == pytest.approx([e["objective/scores"] for e in full[2:]])
    assert json.loads((resumed_dir / "trainer_state.json").read_text())["global_step"] == 4
    assert "Traceback" not in done.stderr


@pytest.mark.xdist_group("ppo-offloaded-run")  # one module-scoped run, one worker
def test_ppo_trains_with_optimizer_and_parameters_offloaded_to_cpu(offloaded_run: tuple[Path, tuple[str, ...]]) -> None:
    """Also from a user's accelerate config that leaves zero3_save_16bit_model false, accelerate's default: before,
    the run died at its first save (accelerate's get_state_dict refuses); the policy is consolidated anyway."""
    from transformers import AutoModelForCausalLM

    out, _ = offloaded_run
    accelerate = (out / "accelerate_config.yaml").read_text()
    assert "offload_optimizer_device: cpu" in accelerate and "offload_param_device: cpu" in accelerate
    assert "zero3_save_16bit_model: true" not in accelerate
    assert len(logged(out)) == 4 and (out / "model.safetensors").is_file()
    for saved in (out, out / "checkpoint-2"):
        assert AutoModelForCausalLM.from_pretrained(saved).num_parameters() > 0


# -- LoRA (the other algorithms train LoRA in tests/launch/test_conformance.py) ----------------------------------

POLICY = RECIPES / "smoke" / "policy"


def completion_logits(model):
    """The logits a model gives a fixed input."""
    import torch

    torch.manual_seed(0)
    return model.eval()(input_ids=torch.randint(3, 400, (2, 12))).logits


def assert_adapter_and_merged_model_load(out: Path) -> None:
    """The run saved an adapter, not a model: from_pretrained loads the base its config names plus the adapter, as
    PEFT does, and it is not the base; merged, the same model in one piece."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    assert (out / "adapter_config.json").is_file() and not (out / "model.safetensors").exists()
    trained = completion_logits(AutoModelForCausalLM.from_pretrained(out))
    base = AutoModelForCausalLM.from_pretrained(POLICY)
    assert not torch.equal(trained, completion_logits(base))
    assert torch.allclose(trained, completion_logits(PeftModel.from_pretrained(base, out)))
    merged = out / "merged"
    assert (merged / "model.safetensors").is_file() and not (merged / "adapter_config.json").exists()
    assert torch.allclose(completion_logits(AutoModelForCausalLM.from_pretrained(merged)), trained, atol=1e-5)


SAVED_AT = 18  # the LoRA learning run's one checkpoint, 2 updates before its end


@pytest.fixture(scope="module")
def lora_learning_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """20 updates of PPO with LoRA on a learnable reward, saving a checkpoint at update 18, which the learning test
    reads and the checkpoint test resumes."""
    out = tmp_path_factory.mktemp("lora-learning") / "run"
    ppo(out, "--no-gather", "--lora", "--merge-adapter",
        pairs=(*LEARNABLE, "lora_target_modules=[q_proj, v_proj, lm_head]", "save_strategy=steps",
               f"save_steps={SAVED_AT}"))
    return out


@pytest.mark.xdist_group("ppo-lora-learning-run")  # one module-scoped run, one worker
def test_ppo_with_lora_learns_on_a_learnable_reward(lora_learning_run: Path) -> None:
    """As test_ppo_end_to_end's learning test, with adapters (rank 16) on the policy and value model and no
    reference model: the KL starts at 0 and the score rises, 0.078 -> 0.187 over the last 3 of 20 updates (Kendall's
    tau with the step 0.56; the value loss 0.019 -> 0.005). The adapters include lm_head's: in this random tiny
    model (weights of std 0.02) only the head moves the output distribution, and with PEFT's default q_proj and
    v_proj alone the score stayed flat over 20 updates (in one process: 0.063 -> 0.060, tau -0.02)."""
    steps = logged(lora_learning_run)
    scores = [entry["objective/scores"] for entry in steps]
    assert len(scores) == 20 and steps[0]["objective/kl"] == 0.0
    first, last = sum(scores[:3]) / 3, sum(scores[-3:]) / 3
    pairs = list(itertools.combinations(range(len(scores)), 2))
    tau = sum((scores[j] > scores[i]) - (scores[j] < scores[i]) for i, j in pairs) / len(pairs)
    assert last > first + 0.05 and tau > 0.4, (tau, scores)
    assert_adapter_and_merged_model_load(lora_learning_run)


@pytest.mark.xdist_group("ppo-lora-learning-run")  # one module-scoped run, one worker
def test_ppo_with_lora_checkpoints_adapters_and_resumes(lora_learning_run: Path, tmp_path: Path) -> None:
    """The learning run's checkpoint resumed, gathering (the run generated from shards: the same tokens)."""
    full = logged(lora_learning_run)
    checkpoint = lora_learning_run / f"checkpoint-{SAVED_AT}"
    assert (checkpoint / "adapter_config.json").is_file() and not (checkpoint / "model.safetensors").exists()
    resumed_dir = tmp_path / "resumed"
    ppo(resumed_dir, "--gather", "--lora", "--resume", str(checkpoint),
        pairs=(*LEARNABLE, "lora_target_modules=[q_proj, v_proj, lm_head]"))
    resumed = logged(resumed_dir)
    assert [entry["step"] for entry in resumed] == list(range(1, 21))
    # The adapters, optimizer, schedule, RNG and data position came back; the frozen weights load from the base.
    for metric in ("objective/scores", "objective/kl"):
        assert [e[metric] for e in resumed[SAVED_AT:]] == pytest.approx([e[metric] for e in full[SAVED_AT:]])


# -- vLLM rollouts (rlhf_cli/rank/engines/vllm/ppo_rollouts.py) ----------------------------------------------------

@needs_vllm
@pytest.mark.parametrize("gather", [("--gather-budget", "0.5"), ("--no-gather", "--lora")],
                         ids=["budget", "no-gather-lora-tied"])
def test_vllm_colocate_rollouts_train_and_sync_within_the_gather_choice(tmp_path: Path, gather: tuple[str, ...],
                                                                        tied_vllm_model: Path) -> None:
    """2 updates from colocated vLLM rollouts; after each, the weights go to vLLM in buckets no larger than the
    gather choice allows (measured on the parameters: with no persistent parameters every whole one is gathered).
    With LoRA vLLM serves the adapters: the base goes once, unmerged, in the same buckets, then the adapters alone,
    checked against what vLLM holds; that run is on a tied Qwen2.5-style stand-in (its own reward and value
    model), whose head vLLM re-processes after each reload.
    vLLM's log-probs are requested: TRL's mismatch metric and importance-sampling weights are logged. (A
    whole-model sync, one bucket: the server test below, and RLOO's in tests/launch/test_vllm_end_to_end.py,
    through the same rlhf_cli/rank/engines/vllm/sync.py.)"""
    out = tmp_path / "run"
    tied = "--lora" in gather
    model = ("--model", str(tied_vllm_model), "--set", f"reward_model_name_or_path={tied_vllm_model}") if tied else ()
    done = ppo(out, *gather, *model, "--max-steps", "2", "--vllm", "colocate", env=VLLM_ENV, timeout=900)
    adapter_bytes = 0  # the saved adapter's: float32, as the policy and its generator hold them
    if tied:
        from safetensors import safe_open

        with safe_open(str(out / "adapter_model.safetensors"), "pt") as saved:
            adapter_bytes = sum(saved.get_tensor(name).nbytes for name in saved.keys() if ".lora_" in name)
        assert adapter_bytes > 0
    steps = logged(out)
    assert len(steps) == 2 and all(set(PPO_METRICS) <= entry.keys() for entry in steps)
    assert all(entry["vllm/sync_seconds"] > 0 for entry in steps)
    # vLLM samples from the policy PPO trains (float32: kernels apart, the same log-probs)
    assert all(entry["sampling/sampling_logp_difference/mean"] < 0.1 for entry in steps), steps
    assert all(0.5 < entry["sampling/importance_sampling_ratio/mean"] < 1.5 for entry in steps), steps
    assert all(" sync " in line for line in done.stdout.splitlines() if line.startswith("step "))  # progress
    for rank in (0, 1):
        record = json.loads((out / "ranks" / f"rank-{rank}.json").read_text())
        assert record["generation_probe"]["calls"] == 0  # HF's generate never ran
        assert len(record["vllm_generation_seconds"]) == 2
        syncs = record["vllm_sync"]
        assert len(syncs) == 2 and syncs[0]["check_logp_difference"] < 1e-3  # the self-check, first sync
        if tied:  # vLLM serves the adapters: the base goes once, unmerged, then the adapters alone
            assert [sync["mode"] for sync in syncs] == ["dense", "adapter"], syncs
            assert all(sync["merged_lora_layers"] == 0 and sync["adapter_groups_verified"] > 0 for sync in syncs)
            assert syncs[1]["bytes_sent"] == syncs[1]["adapter_bytes"] == syncs[0]["adapter_bytes"] == adapter_bytes
            assert syncs[0]["bytes_sent"] == syncs[0]["dense_bytes"] + syncs[0]["adapter_bytes"]
            syncs = syncs[:1]  # the base's sync is bucketed as a dense one
        for sync in syncs:
            share = sync["peak_bytes"] / sync["full_bytes"]
            if gather[0] == "--gather-budget":
                assert 0 < share <= 0.5 and sync["buckets"] > 1
            else:  # one unit a bucket: 2 layers, the tied embedding and head, final norm; a layer is the largest
                assert 0 < share < 0.4 and sync["buckets"] == 4


@needs_vllm
@pytest.mark.timeout(1500)  # a server start (the session's) and two launched runs
def test_vllm_server_rollouts_and_the_trained_weights_reach_the_server(tmp_path: Path, vllm_server: str) -> None:
    """`rlhf vllm-serve` starts the run's server; PPO sends it the run's weights before its first rollout and after
    every update, through a directory (the CPU transport). After the run the server's greedy log-probs are the
    saved policy's (fp32) and not the starting policy's. A second run on the same server samples its first rollout
    from its own starting weights, not from the first run's; in both, vLLM's log-probs are those of the
    distribution it sampled from (at PPO's temperature 0.7), as the importance-sampling weights need them."""
    out = tmp_path / "run"
    ppo(out, "--max-steps", "2", "--vllm", "server", "--set", f"vllm_server_base_url={vllm_server}",
        "--set", "learning_rate=1e-2", timeout=900)
    for rank in (0, 1):
        record = json.loads((out / "ranks" / f"rank-{rank}.json").read_text())
        assert len(record["vllm_generation_seconds"]) == 2 and len(record["vllm_sync"]) == 3
        # The smoke recipe gathers: each sync sends the whole policy in one bucket.
        assert all(sync["buckets"] == 1 and sync["peak_bytes"] == sync["full_bytes"]
                   for sync in record["vllm_sync"])
    served, trained, initial = served_and_saved_logprobs(vllm_server, out)
    assert served == pytest.approx(trained, abs=1e-3)
    assert max(abs(a - b) for a, b in zip(served, initial, strict=True)) > 1e-2
    again = tmp_path / "again"
    ppo(again, "--max-steps", "1", "--vllm", "server", "--set", f"vllm_server_base_url={vllm_server}", timeout=900)
    differences = [entry["sampling/sampling_logp_difference/mean"] for entry in logged(out) + logged(again)]
    assert len(differences) == 3 and max(differences) < 0.05, differences
