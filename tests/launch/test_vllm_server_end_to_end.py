"""`--vllm server` for TRL's trainers (RLOO, GRPO, online DPO) against one `rlhf vllm-serve` (the session's,
which PPO's server test uses too; GRPO trains LoRA, which it serves), one run after another: their weights reach
the server through rlhf's sync over the run's directory (rlhf_cli/rank/engines/vllm/sync.py), never TRL's NCCL
communicator, on the CPU.

Skipped where vLLM is not installed; run them with the Python that has it (README: Tests).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import SMALL_BUCKETS, launch_rlhf, needs_vllm, served_and_saved_logprobs, sets

pytestmark = [needs_vllm]


@pytest.mark.timeout(1500)  # the session's server start, then a launched run
@pytest.mark.parametrize("command", ["rloo", "grpo", "online-dpo"])
def test_trls_trainers_train_against_the_server_through_rlhfs_sync(command: str, tmp_path: Path,
                                                                   vllm_server: str) -> None:
    """2 steps against a server an earlier run left its weights in: the run syncs before each step's generation
    (the first before any: the server's weight version is checked before it generates), so GRPO's vLLM log-probs
    are its policy's (TRL's mismatch metric), and the server ends holding the run's weights after its first update
    (its greedy log-probs are not the starting policy's; TRL syncs before generating, so not the saved ones).
    GRPO trains LoRA, which the server (started with `--lora`) serves itself: the base goes once, then the
    adapters alone, checked against the checksums of the LoRA the server serves."""
    out = tmp_path / "run"
    lora = ("--lora",) if command == "grpo" else ()
    done = launch_rlhf(command, out, "--vllm", "server", "--gather", "--max-steps", "2", *lora,
                       "--set", f"vllm_server_base_url={vllm_server}", "--set", "learning_rate=1e-2",
                       *sets(*SMALL_BUCKETS), timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 2
    if command == "grpo":  # not the earlier run's weights: vLLM's log-probs are the policy's at every step
        differences = [entry["sampling/sampling_logp_difference/mean"] for entry in state["log_history"]
                       if "loss" in entry]
        assert len(differences) == 2 and max(differences) < 0.05, differences
    for rank in (0, 1):
        syncs = json.loads((out / "ranks" / f"rank-{rank}.json").read_text())["vllm_sync"]
        assert len(syncs) == 2  # before each step's generation: the first before any, the second after the update
        assert syncs[0]["buckets"] == 1 and syncs[0]["peak_bytes"] == syncs[0]["full_bytes"]
        if lora:  # the unmerged base and the adapters, then the adapters alone, each checked
            assert [sync["mode"] for sync in syncs] == ["dense", "adapter"], syncs
            assert syncs[0]["groups_verified"] > 0 and syncs[0]["groups_unverified"] == []
            assert all(sync["adapter_groups_verified"] > 0 for sync in syncs)
            assert 0 < syncs[1]["bytes_sent"] == syncs[1]["adapter_bytes"] < syncs[1]["dense_bytes"] / 10
        else:
            assert syncs[1]["buckets"] == 1 and syncs[1]["peak_bytes"] == syncs[1]["full_bytes"]
    # the transport's whole weights, removed when the ranks are done; the adapter the server serves stays
    assert not (out / "vllm-weights").exists() and (out / "vllm-lora").exists() == bool(lora)
    served, _, initial = served_and_saved_logprobs(vllm_server, out)
    assert max(abs(a - b) for a, b in zip(served, initial, strict=True)) > 1e-2


@pytest.mark.timeout(1500)  # a server start, then a launched run
def test_a_bf16_server_is_synced_by_deltas_checked_against_its_checksums(tmp_path: Path,
                                                                        bf16_vllm_server: str) -> None:
    """GRPO in bf16 against a bf16 server at an RL learning rate (1e-6): the first sync reloads whole weight files,
    every later one sends the server only patch files of what changed (at most 10 % of the dense bytes), and
    after each the server's weight checksums equal the policy's on every group (so its weights are bit for bit
    what a full sync sends)."""
    out = tmp_path / "run"
    done = launch_rlhf("grpo", out, "--vllm", "server", "--gather", "--max-steps", "3",
                       *sets(*SMALL_BUCKETS, f"vllm_server_base_url={bf16_vllm_server}", "bf16=true",
                             "learning_rate=1e-6"), timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    for rank in (0, 1):
        syncs = json.loads((out / "ranks" / f"rank-{rank}.json").read_text())["vllm_sync"]
        assert [sync["mode"] for sync in syncs] == ["dense", "sparse", "sparse"], syncs
        assert syncs[0]["groups_verified"] > 0 and syncs[0]["groups_unverified"] == []
        for sync in syncs[1:]:
            assert 0 < sync["bytes_sent"] <= sync["dense_bytes"] / 10 and sync["peak_bytes"] == 0, sync
            assert sync["groups_verified"] == syncs[0]["groups_verified"]
    assert not (out / "vllm-weights").exists()  # the transport's files, removed when the ranks are done
