"""`rlhf plan`'s seconds against step and sync times others published: every published ordering (which of two
configurations is faster) and the error of each time.

Each row is replayed as `plan_published.py` replays memory (the model's config.json from tests/fixtures/models,
the trainer's fields as a recipe) with the GPU named; its prediction is the run's own configuration's seconds
(all phases, or the phases the source timed) times the optimizer steps the source's unit holds, or for a weight
sync the plan's sync model (rlhf_cli/plan/engines/vllm_time.py) on the published model's tensors. Runs of other
stacks (NeMo RL's Megatron, verl's FSDP, DeepSpeed-Chat) are replayed as the TRL-style run that does the same
work under ZeRO-3. Sequences are counted at the recipe's caps, as the plan counts them for any run; a prompt
that no cap of its own bounds, at its data set's published length where there is one. What a source does not
state is assumed, and the table says what; "does not fit" marks a run the plan's memory says
would not fit. Sources this table cannot replay faithfully are listed under it with the reason.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from plan_published import GKD, MS_SWIFT, Published, plan_of, resolved_of

from rlhf_cli.algorithms import algorithm
from rlhf_cli.machine.gpus import GPUS
from rlhf_cli.phases import Phase
from rlhf_cli.plan.columns import Candidate
from rlhf_cli.plan.engines.vllm_time import buckets_seconds
from rlhf_cli.plan.estimate import plan_run
from rlhf_cli.plan.inputs import Inputs, read_inputs
from rlhf_cli.plan.rates import Rates
from rlhf_cli.plan.time import generation_seconds, step_time

SWIFT_FULL, SWIFT_COLOCATE, SWIFT_SERVER = (f"ms-swift [rlhf/gkd/{script}]({MS_SWIFT}/rlhf/gkd/{script})"
                                            for script in ("full.sh", "vllm_colocate.sh", "vllm_server.sh"))
MEGATRON_BRIDGE = "Megatron-LM bridge (the issue's figures: Qwen3-30B-A3B weight sync)"
TRL_MOE_SYNC = "TRL [#3557](https://github.com/huggingface/trl/issues/3557)"


@dataclass(frozen=True)
class Prediction:
    seconds: float
    fits: bool = True  # the plan's verdict on the run's own configuration (a sync alone: True)


@dataclass(frozen=True)
class PublishedTime:
    source: str
    setup: str
    seconds: float  # as published: per optimizer step, per rollout batch, or per weight sync
    unit: str  # "s/step", "s/rollout" or "s/sync"
    assumed: str  # what the source does not state and the replay assumes
    predict: Callable[[Path], Prediction]  # a scratch path for the recipe -> the plan's seconds


def _run(algorithm: str, recipe: dict[str, Any], gpus: int, gpu_memory: str, phases: tuple[str, ...] | None = None,
         steps: float = 1) -> Callable[[Path], Prediction]:
    """`steps` optimizer steps of the run's own configuration as `rlhf plan` gives them: the `phases` named, or all
    of them; `gpus` per machine (`num_machines` in the recipe)."""
    def predict(path: Path) -> Prediction:
        chosen = plan_of(Published("", "", algorithm, recipe, gpus, gpu_memory, True), path).chosen
        assert chosen is not None and chosen.seconds is not None
        seconds = sum(value for phase, value in chosen.seconds.items() if phases is None or phase in phases)
        return Prediction(steps * seconds, chosen.fits)
    return predict


# ms-swift's GKD step (swift/trainers/rlhf_trainer/gkd_trainer.py, `training_step`): with probability `lmbda` (0.5
# in every example) the student generates, and only then is a colocated vLLM woken, synced and put back to sleep
# (rollout_mixin.py, `_fast_infer`); otherwise with `seq_kd` the teacher generates with HF generate, else the
# dataset's response is trained on as it is. Every step the teacher scores the sequence and the student trains.
GKD_LMBDA = 0.5
# Both scripts train on 2000 samples each of alpaca-gpt4-data-en and -zh. ms-swift's dataset table
# (docs/source_en/Instruction/Supported-models-and-datasets.md, "Statistic (token)": whole encoded samples, prompt
# and response, Qwen2.5's tokenizer) gives them 167.6 and 157.2 tokens on average (at most 607 and 544): the
# prompts are counted at that mean, which overstates them (the mean prompt is shorter still).
ALPACA_PROMPT = round((167.6 + 157.2) / 2)


def _gkd(engine: dict[str, object], *, teacher_offloaded: bool = False, teacher_generates: bool = False,
         sleep_level: int | None = None) -> Callable[[Path], Prediction]:
    """ms-swift's GKD Qwen2.5-7B on 4 GPUs as in plan_published.py, the 14B teacher scoring every completion: the
    mean step of `lmbda` steps where the student generates and the rest where the teacher does (`seq_kd`) or
    nobody; the teacher's parameters in host memory with `--teacher_deepspeed zero3_offload`; ms-swift's
    `--sleep_level` where it is not TRL's."""
    recipe = {**GKD, "reward_model_name_or_path": "Qwen/Qwen2.5-14B-Instruct", "gpu": "a100-80gb",
              "plan_prompt_length": ALPACA_PROMPT, **engine}

    def predict(path: Path) -> Prediction:
        run = resolved_of(Published("", "", "rloo", recipe, 4, "81920MiB", True), path)
        plan, inputs = plan_run(run), read_inputs(run)
        assert plan.chosen is not None and not isinstance(inputs, str) and inputs.hardware.gpu is not None
        candidate = plan.chosen.candidate
        if sleep_level is not None:
            assert candidate.colocated is not None
            candidate = replace(candidate, engine_settings=replace(candidate.colocated, sleep_level=sleep_level))
        inputs = replace(inputs, roles=[replace(role, offloaded=teacher_offloaded and role.name == "reward")
                                        for role in inputs.roles])
        seconds = step_time(inputs, candidate, inputs.hardware.gpu, plan.checkpoint_bytes)
        generating = (Phase.GENERATION, Phase.WEIGHT_SYNC)
        every_step = sum(value for phase, value in seconds.items() if phase not in generating)
        student = seconds[Phase.GENERATION] + seconds[Phase.WEIGHT_SYNC]
        teacher = _teacher_generation(inputs, candidate) if teacher_generates else 0.0
        return Prediction(every_step + GKD_LMBDA * student + (1 - GKD_LMBDA) * teacher, plan.chosen.fits)
    return predict


def _teacher_generation(inputs: Inputs, candidate: Candidate) -> float:
    """HF generate of the step's completions by the teacher, gathered under ZeRO-3 as the student would be."""
    teacher = inputs.role("reward")
    assert teacher is not None and inputs.hardware.gpu is not None
    hardware = inputs.hardware
    rates = Rates.of(hardware.gpu, hardware.total_gpus, hardware.machines, candidate.offload_params != "none")
    return generation_seconds(replace(inputs, roles=[teacher]), candidate, rates,
                              algorithm(inputs.algorithm).step_work(inputs.value))


# Qwen3-30B-A3B (its config.json): 30.5B parameters in bf16; 48 layers of 128 experts x 3 matrices, 4 attention
# projections, 2 per-head norms, 2 layer norms and a router, plus embedding, final norm and LM head
QWEN3_30B_A3B_BYTES = 30.5e9 * 2
QWEN3_30B_A3B_TENSORS = 48 * (128 * 3 + 9) + 3


def _qwen3_moe_sync(bucket_bytes: float | None, gpu: str = "h100", gpus: int = 8,
                    server: bool = False) -> Callable[[Path], Prediction]:
    """The sync of every tensor one at a time (`None`) or packed into buckets of `bucket_bytes`, from `gpus` training
    GPUs into a colocated vLLM or to a server."""
    def predict(_: Path) -> Prediction:
        rates = Rates.of(GPUS[gpu], gpus, 1, False)
        tensor = QWEN3_30B_A3B_BYTES / QWEN3_30B_A3B_TENSORS
        if bucket_bytes is None:
            buckets = [(tensor, 1, QWEN3_30B_A3B_TENSORS)]
        else:
            count = math.ceil(QWEN3_30B_A3B_BYTES / bucket_bytes)
            buckets = [(QWEN3_30B_A3B_BYTES / count, QWEN3_30B_A3B_TENSORS // count, count)]
        return Prediction(buckets_seconds(buckets, rates, server=server))
    return predict


GKD_ASSUMED = ("A100 80GB with NVLink; the teacher counted as a ZeRO-3 reward model (no LM head); alpaca prompts "
               f"{ALPACA_PROMPT} tokens (the two data sets' mean whole sample in ms-swift's dataset table, prompt and "
               "response: an upper bound), every response 512; GKD timed as RLOO of the student (its old "
               "log-probs' forward kept)")
CAPS = "every sequence counted at the recipe's caps"


# OpenRLHF's benchmark (DeepSpeed-Chat's settings, Hybrid Engine off): PPO, reward and critic of the actor's size,
# prompts padded to 1024 tokens, answers up to 1024, 1024 rollouts then 8 optimizer steps of 128 (1 PPO epoch),
# ZeRO-3 on 8 A800s (an A100 80GB with NVLink at 400 GB/s: 200 each way), HF generate on the shards.
OPENRLHF = ("OpenRLHF [benchmark/README.md](https://github.com/OpenRLHF/OpenRLHF/blob/main/benchmark/README.md) "
            "(DeepSpeed-Chat)")
DSCHAT_ASSUMED = (f"{CAPS}; gradient checkpointing; the generation latency is generate() alone and the training one "
                  "the actor's and critic's updates (DeepSpeed-Chat's step-3 timer leaves the other forwards out)")
GENERATION_PHASES, TRAINING_PHASES = (Phase.GENERATION,), (Phase.TRAINING, Phase.OPTIMIZER_STEP)


def _dschat(model: str, micro_batch: int, phases: tuple[str, ...]) -> Callable[[Path], Prediction]:
    per_gpu = 1024 // 8
    recipe = {"model_name_or_path": model, "reward_model_name_or_path": model, "dataset_name": "published/rlhf",
              "dtype": "bfloat16", "bf16": True, "gather": False, "gradient_checkpointing": True,
              "per_device_train_batch_size": micro_batch, "gradient_accumulation_steps": per_gpu // micro_batch,
              "local_rollout_forward_batch_size": micro_batch, "num_mini_batches": 8, "num_ppo_epochs": 1,
              "plan_prompt_length": 1024, "response_length": 1024, "gpu": "a100-80gb", "interconnect": "200GB"}
    return _run("ppo", recipe, 8, "81920MiB", phases, steps=8)


# NeMo RL's performance summary (v0.5, Megatron-core training, vLLM colocated): GRPO on OpenMathInstruct-2,
# 64 prompts x 32 generations = 2048 rollouts a step, trained in 4 optimizer steps of 512, sequences up to 4096.
NEMO_RL = ("NeMo RL [performance summary v0.5](https://github.com/NVIDIA-NeMo/RL/blob/main/docs/about/"
           "performance-summary.md), recipes `examples/configs/recipes/llm/performance/grpo-*.yaml`")
NEMO_ASSUMED = (f"{CAPS}: prompt 256 (assumed) + completion 3840, where the published mean sequence is 1,019 "
                "(Llama) and 3,251 (Qwen) tokens; Megatron's tensor and pipeline parallelism replayed as ZeRO-3 "
                "over every GPU; the KL to a reference model (NeMo's default) kept")
NEMO_H100 = f"{NEMO_ASSUMED}; the plan's default link between H100 machines, 50 GB/s a GPU (a DGX H100)"
NEMO_GB200 = (f"{NEMO_ASSUMED}; GB200's GPU as a B200 (2.25 against 2.5 PFLOP/s dense bf16); the NVL72 rack's "
              "trays share one NVLink domain: one machine")


def _nemo(model: str, gpus: int, machines: int, gpu: str, vllm_tp: int) -> Callable[[Path], Prediction]:
    """`gpus` per machine."""
    per_gpu = 2048 // (gpus * machines)
    recipe = {"model_name_or_path": model, "beta": 0.01, "reward_funcs": ["think_format_reward"],
              "dataset_name": "published/math", "dtype": "bfloat16", "bf16": True, "num_machines": machines,
              "per_device_train_batch_size": 1,
              "gradient_accumulation_steps": per_gpu // 4, "steps_per_generation": per_gpu, "num_generations": 32,
              "plan_prompt_length": 256, "max_completion_length": 3840, "gradient_checkpointing": True,
              "use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.6,
              "vllm_tensor_parallel_size": vllm_tp, "gpu": gpu}
    return _run("grpo", recipe, gpus, "81559MiB" if gpu == "h100" else "186GB", steps=4)


# open-r1 at the date (TRL 0.14): GRPO of DeepSeek-R1-Distill-Qwen-1.5B on 7 A100s, vLLM on the 8th;
# TRL 0.14 generated each micro-step (1 prompt x 8 completions a process), 16 of them an optimizer step.
OPEN_R1 = "open-r1 [#161](https://github.com/huggingface/open-r1/issues/161)"
OPEN_R1_RECIPE = {
    "model_name_or_path": "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", "beta": 0.04,
    "reward_funcs": ["think_format_reward"], "dataset_name": "published/numina", "dtype": "bfloat16", "bf16": True,
    "per_device_train_batch_size": 8, "num_generations": 8, "gradient_accumulation_steps": 16,
    "steps_per_generation": 1, "plan_prompt_length": 512, "max_completion_length": 1024,
    "gradient_checkpointing": True, "use_vllm": True, "vllm_mode": "server", "gpu": "a100-80gb"}

# DeepScaleR's 8K stage in verl (FSDP, vLLM colocated at 0.85, TP 1): 128 prompts x 8 = 1024 rollouts a step,
# 2 optimizer steps of 512, prompts up to 1024 tokens, responses up to 8192, KL loss against a reference.
DEEPSCALER = ("rllm (DeepScaleR) [#29](https://github.com/rllm-org/rllm/issues/29), "
              "`scripts/train/run_deepscaler_1.5b_8k.sh`")
DEEPSCALER_ASSUMED = (f"{CAPS}; FSDP replayed as ZeRO-3; verl's token-budget micro-batches (32768 tokens) as "
                      "micro-batches of 2")


def _deepscaler(gpu: str) -> Callable[[Path], Prediction]:
    recipe = {"model_name_or_path": "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", "beta": 0.001,
              "reward_funcs": ["think_format_reward"], "dataset_name": "published/deepscaler", "dtype": "bfloat16",
              "bf16": True, "per_device_train_batch_size": 2, "gradient_accumulation_steps": 32,
              "steps_per_generation": 64, "num_generations": 8, "plan_prompt_length": 1024,
              "max_completion_length": 8192, "gradient_checkpointing": True, "use_vllm": True,
              "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.85, "gpu": gpu}
    return _run("grpo", recipe, 8, "81559MiB" if gpu != "h200" else "143771MiB", steps=2)


ROWS = [
    PublishedTime(SWIFT_FULL, "GKD Qwen2.5-7B, 14B teacher, 4 GPUs, batch 4, response 512: HF generation, the "
                  "teacher generating the off-policy half (`seq_kd`)", 46, "s/step",
                  f"{GKD_ASSUMED}; each step's completions HF-generated by the student (half the steps, `lmbda` "
                  "0.5) or the teacher (the other half), each gathered", _gkd({"use_vllm": False, "gather": True},
                                                                           teacher_generates=True)),
    PublishedTime(SWIFT_COLOCATE, "the same without `seq_kd`, vLLM colocated at 0.3, sleeping (level 1)", 11,
                  "s/step", f"{GKD_ASSUMED}; the teacher ZeRO-3 with its parameters offloaded "
                  "(`--teacher_deepspeed zero3_offload`): its shards fetched from host memory for every forward, "
                  "after its matmuls, not beside them (ms-swift's DeepSpeed configs then set `overlap_comm: "
                  "false`: ZeRO-3 fetches on the compute stream, in every GKD row); the student neither offloaded nor "
                  "synced in batches (`--offload_model`, `--offload_optimizer`, `--move_model_batches` unset); vLLM "
                  "(TP 1, one engine a GPU generating its 4 prompts) woken, synced and put to sleep on the "
                  "generating half of the steps, its weights down to host memory and back each time",
                  _gkd({"vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.3,
                        "vllm_enable_sleep_mode": True}, teacher_offloaded=True, sleep_level=1)),
    PublishedTime(SWIFT_SERVER, "the same, a vLLM server on a GPU of its own, the teacher on the training GPUs", 5,
                  "s/step", f"{GKD_ASSUMED}; the server on 1 GPU of its own (`swift rollout` on a fifth GPU, TP 1), "
                  "the 4 training GPUs' 16 prompts prefilled and decoded there together, synced on the generating "
                  "half of the steps",
                  _gkd({"vllm_mode": "server"})),
    PublishedTime(SWIFT_SERVER, "the same without vLLM: HF generation", 14, "s/step",
                  f"{GKD_ASSUMED}; the student's completions gathered and HF-generated on half the steps",
                  _gkd({"use_vllm": False, "gather": True})),
    PublishedTime(MEGATRON_BRIDGE, "Qwen3-30B-A3B weight sync, tensor by tensor", 84.9, "s/sync",
                  "8 x H100 NVLink, colocated; tensors counted from the architecture", _qwen3_moe_sync(None)),
    PublishedTime(MEGATRON_BRIDGE, "the same in 2 GiB buckets", 11.8, "s/sync", "as above",
                  _qwen3_moe_sync(2 * 2**30)),
    PublishedTime(OPENRLHF, "DeepSpeed-Chat PPO Llama-2-7B (actor, critic, reward, reference), 8 x A800, ZeRO-3, "
                  "micro-batch 8: generation of 1024 rollouts", 697.12, "s/rollout", DSCHAT_ASSUMED,
                  _dschat("meta-llama/Llama-2-7b-hf", 8, GENERATION_PHASES)),
    PublishedTime(OPENRLHF, "DeepSpeed-Chat PPO Llama-2-7B: training on the 1024 rollouts", 492.01, "s/rollout",
                  "as above", _dschat("meta-llama/Llama-2-7b-hf", 8, TRAINING_PHASES)),
    PublishedTime(OPENRLHF, "DeepSpeed-Chat PPO Llama-2-13B, micro-batch 2: generation of 1024 rollouts", 2590.72,
                  "s/rollout", "as above", _dschat("meta-llama/Llama-2-13b-hf", 2, GENERATION_PHASES)),
    PublishedTime(OPENRLHF, "DeepSpeed-Chat PPO Llama-2-13B: training on them", 1218.76, "s/rollout", "as above",
                  _dschat("meta-llama/Llama-2-13b-hf", 2, TRAINING_PHASES)),
    PublishedTime(NEMO_RL, "GRPO Llama-3.1-8B-Instruct, 16 x H100 (2 machines), vLLM TP 1, on policy", 92.8,
                  "s/step", NEMO_H100, _nemo("meta-llama/Llama-3.1-8B-Instruct", 8, 2, "h100", 1)),
    PublishedTime(NEMO_RL, "GRPO Qwen3-32B, 32 x H100 (4 machines), vLLM TP 4, on policy", 376, "s/step",
                  NEMO_H100, _nemo("Qwen/Qwen3-32B", 8, 4, "h100", 4)),
    PublishedTime(NEMO_RL, "GRPO Llama-3.1-8B-Instruct, 8 x GB200 (2 trays of 4), vLLM TP 1", 91.0, "s/step",
                  NEMO_GB200, _nemo("meta-llama/Llama-3.1-8B-Instruct", 8, 1, "b200", 1)),
    PublishedTime(NEMO_RL, "GRPO Qwen3-32B, 16 x GB200 (4 trays of 4), vLLM TP 1", 381, "s/step",
                  NEMO_GB200, _nemo("Qwen/Qwen3-32B", 16, 1, "b200", 1)),
    PublishedTime(OPEN_R1, "GRPO DeepSeek-R1-Distill-Qwen-1.5B, 7 x A100 80GB training + 1 vLLM server, "
                  "8 completions a prompt, GA 16, completions up to 1024 (mean 828 logged)", 281.24, "s/step",
                  f"{CAPS}; prompts 512 (the cap); TRL 0.14's per-micro-step generation as steps_per_generation 1",
                  _run("grpo", OPEN_R1_RECIPE, 7, "81920MiB")),
    PublishedTime(DEEPSCALER, "verl GRPO DeepSeek-R1-Distill-Qwen-1.5B, 8 x A100 80GB, 8K stage", 394, "s/step",
                  DEEPSCALER_ASSUMED, _deepscaler("a100-80gb")),
    PublishedTime(DEEPSCALER, "verl GRPO DeepSeek-R1-Distill-Qwen-1.5B, 8 x H200, 8K stage (3 hours for 30 steps)",
                  360, "s/step", f"{DEEPSCALER_ASSUMED}; the issue's 3 h / 30 steps", _deepscaler("h200")),
    PublishedTime(TRL_MOE_SYNC, "TRL GRPO Qwen3-30B-A3B, 8 x H200: weight sync to a vLLM server, tensor by tensor "
                  "(each parameter gathered and sent on its own)", 40, "s/sync",
                  "'~40s' as the issue puts it; 4 training GPUs and 4 for the server; tensors counted from the "
                  "architecture", _qwen3_moe_sync(None, "h200", 4, server=True)),
]
# (faster, slower) by row index: what each source published as the faster of two configurations
ORDERINGS = [(1, 0), (2, 1), (2, 0), (2, 3), (1, 3), (3, 0), (5, 4), (6, 8), (7, 9), (16, 15)]
NOT_REPLAYED = [
    ("ms-swift DPO Qwen2.5-7B, padding-free 1.90 s/it against padded 3.32 s/it",
     "the plan has no DPO trainer and no padding-free mode: none of the generating trainers has one in TRL 1.16"),
    ("TRL v1.11 server-mode GRPO, 1.08 -> 0.63 s/step on H100",
     "a change inside TRL between versions, one configuration: nothing the plan chooses"),
    ("Hugging Face's async-GRPO write-up, 1.5B LoRA runs on H200",
     "its configurations and times are not stated in the issue that cites it; not replayed from memory"),
    ("TRL's co-located vLLM write-up (huggingface.co/blog/vllm-colocate, TRL #3394): colocated 1.43x (1.5B) and "
     "1.35x (7B) faster than a server, TP slower at 1.5B, 1.73x faster at 7B, 1.26x at 72B",
     "speed-ups only: the throughputs are in figures, the batch sizes and lengths not stated"),
    ("NeMo RL's 1-step and 8-step off-policy rows (e.g. Llama-3.1-8B 64.8 s against 92.8 on policy)",
     "asynchronous GRPO, generation overlapping training: the plan has no asynchronous mode"),
    ("OpenRLHF's Ray rows (Llama-2-7B: vLLM generation 481.86 s against DeepSpeed-Chat's 697.12; 70B on 32 GPUs)",
     "each model on GPUs of its own (1:1:2:2:2): the plan puts every model on every GPU"),
    ("DeepSpeedExamples #718: bloomz-7b1 PPO generation 72 s under ZeRO-3, 0.8 s under ZeRO-2",
     "BLOOM's config.json is not one the plan sizes exactly, the batch is not stated, and the plan has no ZeRO-2"),
    ("rllm #29: DeepScaleR's 8K stage on H100 'no different' from A100",
     "no figure given for the H100"),
]


def _seconds(value: float) -> str:
    return f"{value:.3g}" if value < 1000 else f"{value:.0f}"


def replay(scratch: Path) -> tuple[list[str], list[list[str]], list[str], str]:
    """The table's columns and rows, one line per published ordering, and a line that counts the errors."""
    predicted = [row.predict(scratch / f"time-{index}.yaml") for index, row in enumerate(ROWS)]
    columns = ["source", "configuration", "published", "predicted", "error", "assumed"]
    errors = [(guess.seconds - row.seconds) / row.seconds for row, guess in zip(ROWS, predicted, strict=True)]
    rows = [[row.source, row.setup, f"{row.seconds:g} {row.unit}",
             f"{_seconds(guess.seconds)} {row.unit}" + ("" if guess.fits else " (the plan: does not fit)"),
             f"{error:+.0%}", row.assumed] for row, guess, error in zip(ROWS, predicted, errors, strict=True)]
    orderings = []
    for faster, slower in ORDERINGS:
        right = predicted[faster].seconds < predicted[slower].seconds
        orderings.append(f"{'right' if right else 'WRONG'}: {ROWS[faster].setup} faster than {ROWS[slower].setup} "
                         f"(published {ROWS[faster].seconds:g} against {ROWS[slower].seconds:g}, predicted "
                         f"{_seconds(predicted[faster].seconds)} against {_seconds(predicted[slower].seconds)})")
    within = {share: sum(abs(error) <= share for error in errors) for share in (0.3, 0.5)}
    summary = (f"{sum(line.startswith('right') for line in orderings)} of {len(orderings)} published orderings "
               f"right; {within[0.3]} of {len(ROWS)} times within 30 %, {within[0.5]} within 50 % (errors "
               f"{min(errors):+.0%} to {max(errors):+.0%}).")
    return columns, rows, orderings, summary
