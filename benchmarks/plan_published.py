"""`rlhf plan` against GPU memory that others measured and published.

Each row is a run published with its memory (or with whether it ran out of memory) in enough detail to
replay: the model's config.json written from its public values (tests/fixtures/models), the trainer's
fields as a recipe, the GPUs as the source names them. The script puts the fixtures into a temporary hub
cache, resolves each recipe and plans it as `rlhf plan` does (no torch), and prints the published figure,
the prediction and the error. Supervised fine-tuning rows go through an RLOO plan of the policy alone
(`beta: 0`, a reward function, a 1-token completion after a prompt of the packed length, no-gather): the
model states, activations and ZeRO-3 buffers are the same. Their LM head is not: where the measured
trainer scores tokens differently from the replayed one, the prediction swaps the plan's `train logits`
row for that trainer's head (`memory.logits` with the LogitsModel below) and the table shows both.

ms-swift logs `memory(GiB)`, torch's peak reserved memory in GiB (`get_max_cuda_memory` in its trainer),
also where its example scripts write "GB"; that excludes the CUDA context, which the plan counts.

    python benchmarks/plan_published.py [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from _common import RESULTS, cache_model_configs, markdown_table, print_table, write_markdown

from rlhf_cli.algorithms.spec import LogitsModel
from rlhf_cli.config.resolve import RunRequest, resolve
from rlhf_cli.config.run import ResolvedRun
from rlhf_cli.phases import MemoryPhase
from rlhf_cli.plan import memory
from rlhf_cli.plan.columns import Plan
from rlhf_cli.plan.estimate import plan_run
from rlhf_cli.plan.memory import GIB

HUB_MODELS = {  # hub id -> fixture; the reward and distillation models share their base model's dimensions
    "Qwen/Qwen2.5-7B": "qwen2.5-7b", "Qwen/Qwen3-0.6B": "qwen3-0.6b",
    "meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b", "Skywork/Skywork-Reward-Llama-3.1-8B-v0.2": "llama-3.1-8b",
    "EleutherAI/pythia-12b": "pythia-12b", "EleutherAI/pythia-70m": "pythia-70m",
    "Qwen/Qwen2.5-14B-Instruct": "qwen2.5-14b", "Qwen/Qwen2.5-32B-Instruct": "qwen2.5-32b",
    "Qwen/Qwen2.5-72B-Instruct": "qwen2.5-72b", "meta-llama/Llama-2-7b-hf": "llama-2-7b",
    "meta-llama/Llama-2-13b-hf": "llama-2-13b", "Qwen/Qwen3-32B": "qwen3-32b",
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B": "deepseek-r1-distill-qwen-1.5b"}
MS_SWIFT = "https://github.com/modelscope/ms-swift/blob/main/examples/train"
# The heads of the measured trainers, where they differ from the replayed one's (derivations in memory.py):
# transformers' ForCausalLMLoss upcasts the [tokens, vocabulary] logits to fp32 and takes a log-softmax; its
# backward holds the saved log-softmax, the gradient it receives and the one it returns: 12 bytes an entry.
SFT_LOSS = LogitsModel(sequence_copies=6)
# Liger's fused linear cross-entropy: chunks of a few hundred tokens (its `chunk_size`), under 0.3 GiB here.
SFT_LIGER = LogitsModel()
# TRL 0.25's GRPOTrainer._get_per_token_logps_and_entropies: the completion's logits divided by the
# temperature, their log-softmax, and in the backward the gradients of both: 3 [completion, vocabulary] copies.
GRPO_TRL_025 = LogitsModel(completion_copies=3)
# ms-swift's GKD (`generalized_jsd_loss`, beta 0.5): the student's logits over the sequence in the model's dtype,
# the teacher's (no gradient), then over the response tokens each one's log-softmax, their two-way mixture
# (stacked, then a logsumexp) and the two KL terms, and in the backward the student's log-softmax gradient.
GKD_JSD = LogitsModel(sequence_copies=2, completion_copies=8)
GKD = {"model_name_or_path": "Qwen/Qwen2.5-7B", "beta": 0, "reward_funcs": ["think_format_reward"],
       "dataset_name": "published/alpaca", "dtype": "bfloat16", "bf16": True, "gather": False,
       "per_device_train_batch_size": 4, "gradient_accumulation_steps": 1, "num_generations": 4,
       "steps_per_generation": 1, "plan_prompt_length": 512, "max_completion_length": 512,
       "attn_implementation": "flash_attention_2", "gradient_checkpointing": True, "use_vllm": True,
       # ms-swift's zero3.json and zero3_offload.json when the GKD scripts were added (commit eccb1fd22, PR #6250)
       "overlap_comm": False}
GKD_NOTES = ("GKD replayed as RLOO of the student with the JSD loss's logits as its LM head; alpaca prompts assumed "
             "512 tokens (max_length 2048 caps prompt + 512 response)",)
SFT = {"beta": 0, "reward_funcs": ["think_format_reward"], "max_completion_length": 1, "gather": False,
       "steps_per_generation": 1,  # generation is the replay's, not the run's: keep it to one micro-batch
       "dataset_name": "published/sft", "dtype": "bfloat16", "bf16": True, "gradient_checkpointing": True,
       "model_name_or_path": "Qwen/Qwen2.5-7B"}


@dataclass(frozen=True)
class Published:
    source: str  # where the figure is published
    setup: str  # what ran, in words
    algorithm: str  # the rlhf algorithm that replays it
    recipe: dict[str, Any]
    gpus: int
    gpu_memory: str  # one GPU's memory as nvidia-smi reports it
    ran: bool  # it ran (True) or ran out of memory (False)
    published_gib: float | None = None  # peak per GPU, when a figure is published
    head: LogitsModel | None = None  # the measured trainer's LM head, when not the replayed trainer's
    head_name: str = ""
    notes: list[str] = field(default_factory=list)
    # the measured trainer wakes vLLM while torch's allocator still holds the training phase's blocks, where TRL
    # empties its cache first: vLLM's awake memory comes on top of the training phase
    awake_on_training: bool = False


def sft(source: str, setup: str, tokens: int, accumulation: int, gpus: int, gpu_memory: str,
        published_gib: float | None, *, liger: bool = True, attention: str = "flash_attention_2", batch: int = 1,
        notes: tuple[str, ...] = ()) -> Published:
    """A full fine-tuning of Qwen2.5-7B (or a model of its dimensions) on sequences of `tokens` tokens."""
    recipe = {**SFT, "plan_prompt_length": tokens - 1, "per_device_train_batch_size": batch,
              "gradient_accumulation_steps": accumulation, "attn_implementation": attention,
              "use_liger_kernel": liger}
    head, head_name = (SFT_LIGER, "Liger's fused cross-entropy") if liger else (SFT_LOSS, "transformers' fp32 "
                                                                                        "cross-entropy")
    return Published(source, setup, "rloo", recipe, gpus, gpu_memory, True, published_gib, head, head_name,
                     list(notes))


ROWS = [
    sft(f"ms-swift [liger/sft.sh]({MS_SWIFT}/liger/sft.sh)",
        "SFT Qwen2.5-7B, 4 x A100 80GB, packing 8192, batch 1, GA 2, FlashAttention-2, Liger",
        8192, 2, 4, "81920MiB", 42),
    sft(f"ms-swift [liger/sft.sh]({MS_SWIFT}/liger/sft.sh)", "the same without Liger",
        8192, 2, 4, "81920MiB", 54, liger=False),
    sft(f"ms-swift [cached_dataset/sft.sh]({MS_SWIFT}/cached_dataset/sft.sh)",
        "SFT Qwen2.5-7B, 4 GPUs, packing 8192, batch 1, GA 4, FlashAttention-2, Liger", 8192, 4, 4, "81920MiB", 44),
    sft(f"ms-swift [packing/liger_kernel.sh]({MS_SWIFT}/packing/liger_kernel.sh)",
        "SFT Qwen2.5-7B, 4 x A100 80GB, packing 16384, batch 1, GA 2, FlashAttention-2, Liger",
        16384, 2, 4, "81920MiB", 42),
    sft(f"ms-swift [flash_attention_3/transformers.sh]({MS_SWIFT}/flash_attention_3/transformers.sh)",
        "SFT Qwen2.5-7B, 4 x H20, packing 16384, batch 1, GA 4, FlashAttention-2 or 3, Liger",
        16384, 4, 4, "97871MiB", 43, attention="flash_attention_3"),
    sft("open-r1 [README](https://github.com/huggingface/open-r1), [config_distill.yaml](https://github.com/"
        "huggingface/open-r1/blob/main/recipes/OpenR1-Distill-7B/sft/config_distill.yaml)",
        "SFT OpenR1-Distill-7B (Qwen2.5-Math-7B: Qwen2.5-7B's dimensions), 8 x H100 80GB, no packing, "
        "max length 32768, batch 2, GA 8, FlashAttention-2, Liger: trained", 32768, 8, 8, "81559MiB", None,
        batch=2, notes=("batches padded to the longest of 2 sequences: 2 x 32768 tokens at worst",)),
    Published(f"ms-swift [rlhf/ppo/full.sh]({MS_SWIFT}/rlhf/ppo/full.sh)",
              "PPO Llama-3.1-8B-Instruct, Skywork-Reward-Llama-3.1-8B reward and value, 8 GPUs, batch 1, GA 2, "
              "response 512 (TRL's PPOTrainer, gathering to generate)",
              "ppo", {"model_name_or_path": "meta-llama/Llama-3.1-8B-Instruct",
                      "reward_model_name_or_path": "Skywork/Skywork-Reward-Llama-3.1-8B-v0.2",
                      "dataset_name": "published/alpaca", "dtype": "bfloat16", "bf16": True, "gather": True,
                      "per_device_train_batch_size": 1, "gradient_accumulation_steps": 2, "response_length": 512,
                      "gradient_checkpointing": True},
              8, "81920MiB", True, 65,
              notes=["alpaca prompts are short; the plan's default 512-token prompt changes the KV cache of the "
                     "2 sequences a GPU generates by under 0.3 GiB"]),
    Published("TRL [#4585](https://github.com/huggingface/trl/issues/4585)",
              "GRPO Qwen3-0.6B, 8 x A10 24GB, 20480 tokens, batch 1, 4 generations, vLLM colocated (sleeping "
              "in training): first backward passed, the second ran out of memory",
              "rloo", {"model_name_or_path": "Qwen/Qwen3-0.6B", "beta": 0, "reward_funcs": ["think_format_reward"],
                       "dataset_name": "published/grpo", "dtype": "bfloat16", "bf16": True, "gather": False,
                       "per_device_train_batch_size": 1, "num_generations": 4, "plan_prompt_length": 512,
                       "max_completion_length": 19968, "gradient_checkpointing": True, "use_vllm": True,
                       "vllm_mode": "colocate", "vllm_enable_sleep_mode": True},
              8, "23028MiB", False, None, GRPO_TRL_025, "TRL 0.25's GRPO logits",
              ["the issue does not split the 20480 tokens: 512 prompt + 19968 completion assumed; vLLM at TRL's "
               "default 0.3, TP 1"]),
    Published(f"ms-swift [rlhf/gkd/vllm_colocate.sh]({MS_SWIFT}/rlhf/gkd/vllm_colocate.sh)",
              "GKD Qwen2.5-7B full, Qwen2.5-14B-Instruct teacher (ZeRO-3 offloaded), 4 GPUs, batch 4, response 512, "
              "FlashAttention-2, vLLM colocated at 0.3, sleep level 1",
              "rloo", {**GKD, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.3,
                       "vllm_enable_sleep_mode": True},
              4, "81920MiB", True, 73, GKD_JSD, "GKD's JSD logits",
              [*GKD_NOTES, "the offloaded teacher holds no GPU memory between its forwards; sleep level 1 keeps "
               "vLLM's weights in host memory (not a GPU figure)"], awake_on_training=True),
    Published(f"ms-swift [rlhf/gkd/vllm_server.sh]({MS_SWIFT}/rlhf/gkd/vllm_server.sh)",
              "the same with a vLLM server on a GPU of its own, the teacher under ZeRO-3 on the training GPUs",
              "rloo", {**GKD, "vllm_mode": "server", "reward_model_name_or_path": "Qwen/Qwen2.5-14B-Instruct"},
              4, "81920MiB", True, 54, GKD_JSD, "GKD's JSD logits",
              [*GKD_NOTES, "the teacher counted as a frozen ZeRO-3 shard (as a reward model: its LM head, 0.78B "
               "parameters, 0.4 GiB of shard, left out)"]),
    Published(f"ms-swift [grpo/internal/vllm_72b_4gpu.sh]({MS_SWIFT}/grpo/internal/vllm_72b_4gpu.sh)",
              "GRPO Qwen2.5-72B-Instruct LoRA, 4 x 80 GB, ZeRO-3 with optimizer and parameters offloaded, batch 1, "
              "4 generations, response 1024, vLLM colocated at 0.55, TP 4, sleep level 1, sync in 16 batches",
              "grpo", {"model_name_or_path": "Qwen/Qwen2.5-72B-Instruct", "beta": 0,
                       "reward_funcs": ["think_format_reward"], "dataset_name": "published/numina",
                       "dtype": "bfloat16", "bf16": True, "gather_budget": 0.0625,
                       "use_peft": True, "lora_r": 8, "lora_target_modules": ["all-linear"],
                       "per_device_train_batch_size": 1, "num_generations": 4, "steps_per_generation": 4,
                       "plan_prompt_length": 1024, "max_completion_length": 1024, "gradient_checkpointing": True,
                       "use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.55,
                       "vllm_tensor_parallel_size": 4, "vllm_enable_sleep_mode": True,
                       "__offload__": ("cpu", "cpu")},
              4, "81920MiB", True, None,
              notes=["ms-swift's LoRA defaults (rank 8, all linear layers); prompts assumed 1024 tokens "
                     "(max_length 2048); move_model_batches 16 as a gather budget of 1/16 of the policy"],
              awake_on_training=True),
    Published("ms-swift [#7986](https://github.com/modelscope/ms-swift/issues/7986)",
              "GRPO Qwen2.5-32B full, 4 x H100 80GB, vLLM colocated, the whole policy gathered for the weight sync: "
              "out of memory",
              "grpo", {**(SYNC_32B := {
                  "model_name_or_path": "Qwen/Qwen2.5-32B-Instruct", "beta": 0, "reward_funcs": ["think_format_reward"],
                  "dataset_name": "published/grpo", "dtype": "bfloat16", "bf16": True, "per_device_train_batch_size": 1,
                  "num_generations": 4, "steps_per_generation": 4, "plan_prompt_length": 1024,
                  "max_completion_length": 1024, "gradient_checkpointing": True, "use_vllm": True,
                  "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.4, "vllm_tensor_parallel_size": 4,
                  "vllm_enable_sleep_mode": True, "__offload__": ("cpu", "cpu")}), "gather": True},
              4, "81559MiB", False, None,
              notes=["the issue gives no script: ZeRO-3 with optimizer and parameters offloaded (32B's states, "
                     "122 GiB a GPU otherwise, fit nowhere), vLLM at 0.4, TP 4, sleep, 1024 + 1024 tokens assumed"],
              awake_on_training=True),
    Published("ms-swift [#7986](https://github.com/modelscope/ms-swift/issues/7986)",
              "the same, the sync gathering one bucket at a time (move_model_batches 16 as a 1/16 gather budget): ran",
              "grpo", {**SYNC_32B, "gather_budget": 0.0625}, 4, "81559MiB", True, None,
              notes=["as above"], awake_on_training=True),
    Published("TRL's `ds3_gather_for_generation` (this project's seed)",
              "PPO pythia-12b, pythia-70m reward and value, 4 x 24 GB, optimizer offload, gathering",
              "ppo", {"__recipe__": "ppo/pythia-12b-descriptiveness"}, 4, "23.7GiB", False),
    Published("TRL's `ds3_gather_for_generation` (this project's seed)", "the same without gathering",
              "ppo", {"__recipe__": "ppo/pythia-12b-descriptiveness", "gather": False}, 4, "23.7GiB", True),
]


@dataclass(frozen=True)
class Replayed:
    row: Published
    planned: int  # `rlhf plan`'s peak for the run's own configuration
    predicted: int  # with the measured trainer's LM head
    fits: bool


def plan_of(row: Published, recipe_path: Path) -> Plan:
    plan = plan_run(resolved_of(row, recipe_path))
    if not plan.known:
        raise RuntimeError(f"{row.setup}: no plan: {plan.why_unknown}")
    return plan


def resolved_of(row: Published, recipe_path: Path) -> ResolvedRun:
    """The row's run resolved as `rlhf plan` resolves it (its recipe written to `recipe_path`)."""
    recipe = dict(row.recipe)
    bundled = recipe.pop("__recipe__", None)
    flags = _hardware(row)
    offload = recipe.pop("__offload__", None)
    if offload:
        flags |= {"offload_optimizer": ("--offload-optimizer", offload[0]),
                  "offload_params": ("--offload-params", offload[1])}
    if bundled:
        sets = tuple(f"{key}={str(value).lower()}" for key, value in recipe.items())
        request = RunRequest(row.algorithm, bundled, flags, sets, planning=True)
    else:
        recipe_path.write_text(yaml.safe_dump(recipe))
        request = RunRequest(row.algorithm, str(recipe_path), flags, planning=True)
    return resolve(request, cuda=True)


def _hardware(row: Published) -> dict[str, tuple[str, Any]]:
    return {"gpu_memory": ("--gpu-memory", row.gpu_memory), "num_gpus": ("--num-gpus", row.gpus)}


def replay(row: Published, recipe_path: Path) -> Replayed:
    """The plan of the row's run, and its peak with the measured trainer's LM head."""
    plan = plan_of(row, recipe_path)
    column, work, policy = plan.chosen, plan.work, plan.roles[0].size
    assert column is not None and work is not None and plan.hardware is not None
    rows = column.components
    if row.head is not None:
        head = memory.logits(row.head, policy, max(work.train_batch, work.score_batch), work.train_sequence,
                             work.completion_length, work.element_bytes)
        rows = [memory.Component(part.name, part.phase, head) if part.name == "train logits" else part
                for part in rows]
    if row.awake_on_training:
        rows = [memory.Component(part.name, MemoryPhase.TRAINING, part.gpu)
                if part.name in ("vLLM awake", "gen: sync bucket cached") else part for part in rows]
    predicted = memory.peak(rows)
    return Replayed(row, column.peak, predicted, memory.fits(predicted, plan.hardware.gpu_memory))


def _gib(value: float) -> str:
    return f"{value / GIB:.1f}"


def _error(predicted: int, published_gib: float) -> str:
    return f"{(predicted / GIB - published_gib) / published_gib:+.1%}"


def table(replays: list[Replayed]) -> tuple[list[str], list[list[str]]]:
    columns = ["source", "configuration", "published GiB", "predicted GiB", "error", "verdict: published / predicted",
               "LM head predicted", "`rlhf plan` GiB (error)"]
    rows = []
    for replayed in replays:
        row, published = replayed.row, replayed.row.published_gib
        verdict = f"{'ran' if row.ran else 'out of memory'} / {'fits' if replayed.fits else 'does not fit'}"
        planned = _gib(replayed.planned) + (f" ({_error(replayed.planned, published)})" if published else "")
        rows.append([row.source, "; ".join([row.setup, *row.notes]), f"{published:g}" if published else "-",
                     _gib(replayed.predicted), _error(replayed.predicted, published) if published else "-", verdict,
                     row.head_name or "the plan's", planned])
    return columns, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS, help="where plan_published.md goes")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        os.environ["HF_HUB_CACHE"] = str(Path(scratch) / "hub")
        cache_model_configs(Path(scratch) / "hub", HUB_MODELS)
        replays = [replay(row, Path(scratch) / f"row-{index}.yaml") for index, row in enumerate(ROWS)]
        from published_times import NOT_REPLAYED
        from published_times import replay as replay_times

        time_columns, time_rows, orderings, time_summary = replay_times(Path(scratch))
    columns, rows = table(replays)
    print_table("rlhf plan against published peaks per GPU", columns, rows)
    agree = sum(r.fits == r.row.ran for r in replays)
    numeric = [r for r in replays if r.row.published_gib is not None]
    within = sum(abs(r.predicted / GIB - r.row.published_gib) <= 0.15 * r.row.published_gib for r in numeric)
    summary = (f"Verdicts agree in {agree} of {len(replays)} rows; {within} of {len(numeric)} published figures "
               f"are within 15% of the prediction.")
    print(summary)
    print_table("rlhf plan against published step and sync times", time_columns, time_rows)
    print("\n".join([*orderings, time_summary]))
    method = "\n\n".join(__doc__.split("\n\n")[1:-1])
    import published_times

    skipped = "\n".join(f"- {what}: {why}" for what, why in NOT_REPLAYED)
    write_markdown(args.out / "plan_published.md", f"# `rlhf plan` against published GPU memory\n\n{method}\n\n"
                   f"{markdown_table(columns, rows)}\n{summary}\n\n"
                   f"# `rlhf plan` against published step and sync times\n\n{published_times.__doc__}\n"
                   f"{markdown_table(time_columns, time_rows)}\n"
                   + "\n".join(f"- {line}" for line in orderings) + f"\n\n{time_summary}\n\n"
                   f"Not replayed:\n\n{skipped}\n")


if __name__ == "__main__":
    main()
