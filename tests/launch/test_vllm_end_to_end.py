"""vLLM generation end to end: RLOO, GRPO and online DPO with `--vllm colocate`, 2 ranks under ZeRO-3 on the CPU,
each with another gather choice (whole policy, a budget, one layer at a time) bounding the weight sync; GRPO's on
a tied Qwen2.5-style stand-in, the others on the smoke Llama.

Skipped where vLLM is not installed; run them with the Python that has it (README: Tests).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from helpers import SMALL_BUCKETS, launch_rlhf, needs_vllm, sets, write

pytestmark = [needs_vllm]

LAYER_BYTES = 41088 * 4  # one decoder layer of the smoke policy, float32: its largest unit
POLICY_BYTES = 146240 * 4


def _sync_records(out: Path) -> list[list[dict]]:
    return [json.loads((out / "ranks" / f"rank-{rank}.json").read_text())["vllm_sync"] for rank in (0, 1)]


@pytest.mark.parametrize(("command", "gather", "extra"), [
    ("grpo", "--gather-budget", ("0.5", "--set", "learning_rate=0.3")),  # on the tied stand-in: a layer fits
    ("online-dpo", "--no-gather", ()),
    ("rloo", "--gather", ()),
], ids=["grpo-budget-tied", "online-dpo-no-gather", "rloo-gather"])
def test_vllm_colocate_trains_and_syncs_within_the_gather_choice(command: str, gather: str, extra: tuple[str, ...],
                                                                tmp_path: Path, tied_vllm_model: Path) -> None:
    """GRPO on a tied Qwen2.5-style stand-in (one KV head, q/k/v biases), its own reward model: vLLM samples
    from the trained head after every update (its tied LM head re-processed after each reload)."""
    out = tmp_path / "run"
    tied = command == "grpo"
    model = ("--model", str(tied_vllm_model), "--set", f"reward_model_name_or_path={tied_vllm_model}") if tied else ()
    done = launch_rlhf(command, out, "--vllm", "colocate", gather, *extra, *model, "--max-steps", "2",
                       *sets(*SMALL_BUCKETS), timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    state = json.loads((out / "trainer_state.json").read_text())
    steps = [entry for entry in state["log_history"] if "loss" in entry]
    assert state["global_step"] == 2 and len(steps) == 2
    progress = [line for line in done.stdout.splitlines() if line.startswith("step ")]
    assert progress and all("  sync " in line for line in progress)
    assert " check " in progress[0]  # the self-check after the first sync, on the progress line
    full = _model_bytes(tied_vllm_model) if tied else POLICY_BYTES
    for records in _sync_records(out):
        assert len(records) >= 2  # once per generation: the policy vLLM samples from is the trained one
        assert records[0]["check_logp_difference"] < 1e-3  # vLLM's logprobs are the policy's on the probe
        for record in records:
            assert record["full_bytes"] == full
            if gather == "--gather":
                assert record["buckets"] == 1 and record["peak_bytes"] == POLICY_BYTES
            elif gather == "--no-gather":
                assert record["buckets"] == 5 and record["peak_bytes"] <= LAYER_BYTES
            else:  # ZeRO-3's own account of what was whole at once stays within the budget
                assert record["buckets"] > 1 and record["peak_bytes"] <= full / 2
    if tied:  # vLLM's logprobs are the policy's, after each update at a learning rate of 0.3 (TRL's metric)
        differences = [(entry["sampling/sampling_logp_difference/mean"], entry["sampling/sampling_logp_difference/max"])
                       for entry in steps]
        assert all(mean < 0.1 and largest < 0.1 for mean, largest in differences), differences


def _model_bytes(path: Path) -> int:
    """float32 bytes of a saved model's parameters (a tied head is saved once, as the policy holds it)."""
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), "pt") as saved:
        return sum(math.prod(saved.get_slice(name).get_shape()) * 4 for name in saved.keys())


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_a_bf16_generator_is_synced_by_deltas_of_what_changed(lora: bool, tmp_path: Path,
                                                              tied_vllm_model: Path) -> None:
    """GRPO with a bf16 policy and generator at an RL learning rate (1e-6), on the tied stand-in: the first sync is
    dense, every later one a shard-local delta of at most 10 % of the dense bytes, checked bit for bit against the
    policy's weights after every sync (all parameter groups) and by the logprob self-check after a delta. With
    LoRA (a larger learning rate: adapters start at zero) vLLM serves the adapters itself: the first sync sends the
    base unmerged, every later one the adapter matrices alone, checked bit for bit against those vLLM serves."""
    out = tmp_path / "run"
    rate = "learning_rate=1e-3" if lora else "learning_rate=1e-6"
    adapters = ("--lora", "--set", "lora_target_modules=[q_proj, v_proj]") if lora else ()
    done = launch_rlhf("grpo", out, "--vllm", "colocate", "--no-gather", "--model", str(tied_vllm_model), *adapters,
                       "--max-steps", "4", *sets(*SMALL_BUCKETS, f"reward_model_name_or_path={tied_vllm_model}",
                                                 "bf16=true", rate, "vllm_sync_check_steps=2"),
                       timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    progress = [line for line in done.stdout.splitlines() if line.startswith("step ")]
    later = " adapter " if lora else " sparse "
    assert " dense " in progress[0] and all(later in line for line in progress[1:]), progress
    sent = _adapter_bytes(tied_vllm_model, out) if lora else 0
    for records in _sync_records(out):
        assert len(records) == 4 and records[0]["mode"] == "dense", records
        assert records[0]["dense_bytes"] == _model_bytes(tied_vllm_model) // 2
        assert records[0]["bytes_sent"] == records[0]["dense_bytes"] + sent  # the base, unmerged, and the adapters
        assert records[0]["groups_verified"] > 0 and records[0]["groups_unverified"] == []
        for record in records[1:]:
            assert record["peak_memory_bytes"] > 0
            if lora:  # the adapters alone, every one of them, each group checked against what vLLM serves
                assert record["mode"] == "adapter" and record["scope"].startswith("LoRA: only the adapter"), record
                assert record["bytes_sent"] == record["adapter_bytes"] == sent < record["dense_bytes"] / 10, record
                assert record["adapter_groups_verified"] == 2, record  # each layer's self_attn
                assert 0 < record["peak_bytes"] <= 2 * sent  # the adapters gathered, in float32 at most
            else:
                assert record["mode"] == "sparse" and record["peak_bytes"] == 0, record  # nothing gathered
                assert record["groups_verified"] == records[0]["groups_verified"]
                assert record["bytes_sent"] <= record["dense_bytes"] / 10 and 0 <= record["changed_share"] < 0.1
        assert records[1]["check_logp_difference"] < 0.1  # the self-check passes after a delta (bf16 tolerance)
    summary = json.loads((out / "summary.json").read_text())
    assert [sync["mode"] for sync in summary["weight_syncs"]] == ["dense", *[later.strip()] * 3]
    assert not (out / "vllm-lora").exists()  # the adapters vLLM loaded from files, removed when the ranks are done


def _adapter_bytes(path: Path, out: Path) -> int:
    """bf16 bytes of the run's saved adapter (its rank, on each weight of a module it targets): A (r x in) and B
    (out x r); the adapter trained (its B matrices are not all zero)."""
    from safetensors import safe_open

    config = json.loads((out / "adapter_config.json").read_text())
    rank, targets = config["r"], set(config["target_modules"])
    with safe_open(str(out / "adapter_model.safetensors"), "pt") as saved:
        assert any(saved.get_tensor(name).abs().sum() > 0 for name in saved.keys() if ".lora_B." in name)
    with safe_open(str(path / "model.safetensors"), "pt") as saved:
        shapes = [saved.get_slice(name).get_shape() for name in saved.keys()
                  if name.endswith(".weight") and name.rsplit(".", 2)[-2] in targets]
    return sum(rank * (rows + columns) * 2 for rows, columns in shapes)


# Loaded by every Python process of the run (sitecustomize): the weight sync drops every MLP down-projection, so
# vLLM keeps the starting ones; the sync itself succeeds.
DROPPED_GROUP = '''import rlhf_cli.compat.vllm as vllm_compat

reload = vllm_compat.vllm_reload_weights


def without_down_projections(llm, weights):
    return reload(llm, ((name, tensor) for name, tensor in weights if ".down_proj." not in name))


vllm_compat.vllm_reload_weights = without_down_projections
'''

# The same, for a delta sync: vLLM never receives the patches of one parameter; the patching itself succeeds.
DROPPED_PATCH = '''import rlhf_cli.compat.vllm as vllm_compat

apply = vllm_compat.vllm_apply_patches


def without_one(model, patches, kept):
    return apply(model, [patch for patch in patches if patch[0] != "model.layers.1.mlp.down_proj.weight"], kept)


vllm_compat.vllm_apply_patches = without_one
'''


@pytest.mark.parametrize(("broken", "settings", "line"), [
    (DROPPED_GROUP, ("learning_rate=0.3",), "after weight sync 2, "),
    (DROPPED_PATCH, ("learning_rate=1e-3", "bf16=true"),
     "after weight sync 2, the generator's model.layers.1.mlp.down_proj.weight differs from the policy's"),
], ids=["dense-fp32-dropped-group", "delta-bf16-dropped-patch"])
def test_a_short_run_with_a_broken_sync_stops(broken: str, settings: tuple[str, ...], line: str,
                                              tmp_path: Path) -> None:
    """3 GRPO steps whose sync loses weights. fp32 (dense syncs) dropping a parameter group: the first sync sends
    the starting weights vLLM already holds and passes; the checks after the second (the first update's weights)
    stop the run. bf16 (a delta after the first sync) losing one parameter's patches: the checksums after the
    first delta stop the run with one line naming that parameter."""
    site = write(tmp_path / "site" / "sitecustomize.py", broken).parent
    path = os.pathsep.join(part for part in (str(site), os.environ.get("PYTHONPATH", "")) if part)
    done = launch_rlhf("grpo", tmp_path / "run", "--vllm", "colocate", "--gather", "--max-steps", "3",
                       *sets(*settings, *SMALL_BUCKETS), env={"PYTHONPATH": path}, timeout=900)
    assert done.returncode != 0
    assert line in done.stderr and "differ" in done.stderr, done.stderr[-3000:]
    if broken is DROPPED_PATCH:  # the run's own failure line names the parameter
        assert any(text.startswith("Error: rank ") and line in text for text in done.stderr.splitlines())
