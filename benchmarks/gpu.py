"""On one NVIDIA GPU: the real `rlhf` commands in bf16 under ZeRO-3, measured beside `rlhf plan`'s prediction.

Random-weight models from public configs: a policy of pythia-1b's shape (GPT-NeoX, 1.01B parameters) and a
reward model of pythia-70m's (PPO's value model starts from it), both with the smoke tokenizer (its 500 tokens
are the first of the models' 50304; sampled ids beyond it decode to nothing). Each algorithm of ALGORITHMS runs
with --gather and with --no-gather (ZeRO-3's live parameters bounded), and PPO once more with the optimizer
offloaded to the CPU: a few steps each through `python -m rlhf_cli ALGO ...`, 1 process, with
RLHF_PROBE_CUDA_MEMORY=1, under which the rank records the peak CUDA memory of each phase (load, generation,
train) and the start and length of every generation call (`rlhf_cli/rank/probes.py`, `ranks/rank-0.json`).
Beside each run: `rlhf plan ALGO <the same flags> --gpu-memory <the GPU's> --json`.
Before them all, the first run with `--rehearse` (its output in rehearsal.txt): the plan checked on this GPU.

    python benchmarks/gpu.py --dry-run   # any machine, seconds: write the configs, build and check every command
    python benchmarks/gpu.py             # one GPU: run them all; writes gpu.md and gpu.json into --out

Before any launch (and alone, with --dry-run) every command goes through `rlhf ... --dry-run --json` and
`rlhf plan ... --json` and is checked: each flag reached the resolved run, bf16 is on, the plan is known and
counts 2 bytes per element. On the lent GPU machine, which has no network, see benchmarks/README.md: the
packages it lacks travel as wheels (benchmarks/gpu_setup/).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from _common import (
    RECIPES,
    REPO,
    RESULTS,
    WORK,
    CommandFailed,
    json_output,
    markdown_table,
    print_table,
    python_module,
    run_timed,
    write_markdown,
)

sys.path.insert(0, str(REPO))  # this checkout's rlhf_cli, as the commands run it
from rlhf_cli.machine.probe import nvidia_gpu_memory, nvidia_smi  # noqa: E402 (imports no torch)
from rlhf_cli.sizes import parse_size  # noqa: E402

GIB = 2**30
H200_MEMORY = "143771MiB"  # nvidia-smi's total on the lent H200; --gpu-memory in a dry run on another machine
SMOKE_TOKENIZER = RECIPES / "smoke" / "policy"
PROMPTS = RECIPES / "smoke" / "prompts.jsonl"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
RUN_ENV = {"RLHF_PROBE_CUDA_MEMORY": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
# EleutherAI/pythia-70m's config.json; pythia-1b differs in width and depth only.
PYTHIA_70M = {"model_type": "gpt_neox", "hidden_act": "gelu", "hidden_size": 512, "intermediate_size": 2048,
              "initializer_range": 0.02, "layer_norm_eps": 1e-05, "max_position_embeddings": 2048,
              "num_attention_heads": 8, "num_hidden_layers": 6, "rotary_emb_base": 10000, "rotary_pct": 0.25,
              "tie_word_embeddings": False, "use_cache": True, "use_parallel_residual": True, "vocab_size": 50304}
PYTHIA_1B = {**PYTHIA_70M, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16}
# No-gather runs bound what ZeRO-3 keeps live to a tenth of the policy: DeepSpeed's default (1e9) is about the
# whole 1.01B model, which would make generating from shards hold what gathering holds.
MAX_LIVE_PARAMETERS = 100_000_000
PREFETCH_BUCKET = 50_000_000  # DeepSpeed's default


@dataclass(frozen=True)
class Model:
    directory_name: str
    config: dict[str, Any]
    architecture: str  # the transformers class that builds it


POLICY = Model("pythia-1b-shape", PYTHIA_1B, "GPTNeoXForCausalLM")
REWARD = Model("pythia-70m-shape-reward", PYTHIA_70M, "GPTNeoXForSequenceClassification")


@dataclass(frozen=True)
class Algorithm:
    """One `rlhf` training command and the per-process workload it runs here."""

    command: str
    recipe: str  # the bundled smoke recipe it starts from (data, learning rate, logging)
    completion_key: str  # the trainer field of the completion length
    workload: dict[str, Any]
    episodes_per_step: int | None = None  # PPO counts episodes and ignores max_steps
    optional: bool = False  # not every rlhf has it: skipped, with the reason, where it is missing

    def step_flags(self, steps: int) -> list[str]:
        if self.episodes_per_step:
            return ["--set", f"total_episodes={steps * self.episodes_per_step}"]
        return ["--max-steps", str(steps)]


# Every algorithm the check covers; extend here. 8 sequences generated per step in each.
ALGORITHMS = (
    Algorithm("ppo", "ppo/smoke", "response_length",
              {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "num_mini_batches": 1,
               "local_rollout_forward_batch_size": 8}, episodes_per_step=8),
    Algorithm("rloo", "rloo/smoke", "max_completion_length", {"per_device_train_batch_size": 8, "num_generations": 4}),
    Algorithm("online-dpo", "online_dpo/smoke", "max_new_tokens", {"per_device_train_batch_size": 4}),
    Algorithm("grpo", "grpo/smoke", "max_completion_length", {"per_device_train_batch_size": 8, "num_generations": 4},
              optional=True),
)
OFFLOAD_ALGORITHM = "ppo"  # the seed experiment's: PPO with the optimizer on the CPU, and PPO with LoRA


@dataclass(frozen=True)
class Mode:
    name: str
    gather: bool
    offload_optimizer: str
    flags: tuple[str, ...]
    lora: bool = False


GATHER = Mode("gather", True, "none", ("--gather",))
NO_GATHER = Mode("no-gather", False, "none", (
    "--no-gather", "--set", f"stage3_max_live_parameters={MAX_LIVE_PARAMETERS}",
    "--set", f"stage3_prefetch_bucket_size={PREFETCH_BUCKET}"))
OFFLOAD = Mode("gather+offload", True, "cpu", ("--gather", "--offload-optimizer", "cpu"))
LORA = Mode("no-gather+lora", False, "none", (*NO_GATHER.flags, "--lora"), lora=True)


@dataclass(frozen=True)
class Setup:
    policy: Path
    reward: Path
    runs_dir: Path
    steps: int
    completion: int
    prompt_length: int
    gpu_memory: int


@dataclass(frozen=True)
class Run:
    algorithm: Algorithm
    mode: Mode

    @property
    def name(self) -> str:
        return f"{self.algorithm.command}/{self.mode.name}"

    def settings(self, setup: Setup) -> dict[str, Any]:
        """Every `--set` of the run."""
        return {**self.algorithm.workload, self.algorithm.completion_key: setup.completion, "bf16": True,
                "plan_prompt_length": setup.prompt_length}

    def set_values(self, setup: Setup) -> dict[str, Any]:
        """Every `--set KEY=VALUE` among the run's flags, the mode's included, VALUE read back."""
        flags = self.flags(setup)
        pairs = [flags[index + 1].split("=", 1) for index, flag in enumerate(flags) if flag == "--set"]
        return {key: json.loads(value) for key, value in pairs}

    def output_dir(self, setup: Setup) -> Path:
        return setup.runs_dir / self.name.replace("/", "-").replace("+", "-")

    def flags(self, setup: Setup) -> list[str]:
        """The run's flags, the same for `rlhf ALGO` and `rlhf plan ALGO`."""
        sets = [part for key, value in self.settings(setup).items() for part in ("--set", f"{key}={json.dumps(value)}")]
        return ["-r", self.algorithm.recipe, "--model", str(setup.policy), "--reward-model", str(setup.reward),
                "--num-processes", "1", *sets, *self.algorithm.step_flags(setup.steps), *self.mode.flags,
                "-o", str(self.output_dir(setup)), "--overwrite"]

    def command(self, setup: Setup) -> list[str]:
        return python_module("rlhf_cli", self.algorithm.command, *self.flags(setup))

    def plan_command(self, setup: Setup) -> list[str]:
        return python_module("rlhf_cli", "plan", self.algorithm.command, *self.flags(setup),
                             "--gpu-memory", str(setup.gpu_memory), "--json")


def all_runs(algorithms: Sequence[Algorithm]) -> list[Run]:
    """Every algorithm gathered, PPO with optimizer offload, every algorithm without gathering, PPO with LoRA."""
    ppo = [a for a in algorithms if a.command == OFFLOAD_ALGORITHM]
    return [Run(a, GATHER) for a in algorithms] + [Run(a, OFFLOAD) for a in ppo] + \
        [Run(a, NO_GATHER) for a in algorithms] + [Run(a, LORA) for a in ppo]


# -- models -------------------------------------------------------------------------------------------

def write_config(model: Model, directory: Path) -> Path:
    """config.json (the public shape, the smoke tokenizer's special tokens, bf16) and the smoke tokenizer."""
    special = json.loads((SMOKE_TOKENIZER / "generation_config.json").read_text())
    config = {**model.config, "architectures": [model.architecture], "dtype": "bfloat16",
              **{key: special[key] for key in ("bos_token_id", "eos_token_id", "pad_token_id")}}
    files = TOKENIZER_FILES
    if model.architecture.endswith("ForSequenceClassification"):
        config.update(id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0})
    else:
        files += ("generation_config.json",)
    directory.mkdir(parents=True, exist_ok=True)
    for name in files:
        shutil.copy(SMOKE_TOKENIZER / name, directory / name)
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    # Until write_weights replaces it: a whole safetensors file of no tensors, so that the dry mode's resolution
    # (which refuses a model directory without weights) passes without torch; nothing loads it.
    empty_header = b"{}"
    (directory / "model.safetensors").write_bytes(len(empty_header).to_bytes(8, "little") + empty_header)
    return directory


def write_weights(model: Model, directory: Path) -> int:
    """Random bf16 weights for the config in `directory` (seed 0), built on the CPU so that this process holds
    no CUDA context while the runs measure the GPU; returns the parameter count."""
    import torch
    import transformers

    config = transformers.AutoConfig.from_pretrained(directory)
    torch.manual_seed(0)
    network = getattr(transformers, model.architecture)._from_config(config, dtype=torch.bfloat16)
    network.save_pretrained(directory)
    return network.num_parameters()


def longest_prompt_tokens() -> int:
    """The smoke prompts' longest, in tokens: the plan's prompt length (`plan_prompt_length`)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(SMOKE_TOKENIZER / "tokenizer.json"))
    prompts = [json.loads(line)["prompt"] for line in PROMPTS.read_text().splitlines() if line.strip()]
    return max(len(tokenizer.encode(prompt).ids) for prompt in prompts)


# -- checks of the resolved run and the plan ----------------------------------------------------------

def missing_reason(algorithm: Algorithm) -> str | None:
    """Why this rlhf cannot run the algorithm, or None."""
    if not (RECIPES / f"{algorithm.recipe}.yaml").exists():
        return f"no bundled recipe {algorithm.recipe}"
    try:
        run_timed(python_module("rlhf_cli", algorithm.command, "--help"), timeout=60)
    except CommandFailed:
        return f"no `rlhf {algorithm.command}` command"
    return None


def plan_phases(column: dict[str, Any]) -> dict[str, int]:
    """The plan's static total and its generation and training peaks (a rank's training phase holds the
    backward and the optimizer step); static plus the larger must give the plan's own peak."""
    phases = column["phases"]
    totals = {"static": phases["static"], "generation": phases["generation"],
              "training": max(phases["training"], phases["step"])}
    if totals["static"] + max(totals["generation"], totals["training"]) != column["peak_gpu"]:
        raise ValueError(f"plan phases {phases} do not add up to its peak {column['peak_gpu']}")
    return totals


def chosen_column(plan: dict[str, Any]) -> dict[str, Any]:
    return next(column for column in plan["configurations"] if column["chosen"])


def check_resolved(run: Run, resolved: dict[str, Any], setup: Setup, on_gpu: bool) -> list[str]:
    """What `rlhf ALGO ... --dry-run --json` must show for the run to be the one measured; `on_gpu`: resolved on
    a machine with an NVIDIA GPU, where it must use it (elsewhere rlhf picks DeepSpeed's CPU path itself)."""
    accelerate = resolved["accelerate"]
    trainer, deepspeed = resolved["trainer"], accelerate.get("deepspeed_config", {})
    groups = [resolved[group] for group in ("trainer", "model", "script", "zero3")]
    expected = {"bf16 on": (trainer.get("bf16"), True),
                "ds3_gather_for_generation": (trainer.get("ds3_gather_for_generation"), run.mode.gather),
                "zero_stage": (deepspeed.get("zero_stage"), 3),
                "offload_optimizer_device": (deepspeed.get("offload_optimizer_device"), run.mode.offload_optimizer),
                "use_peft": (bool(resolved["model"].get("use_peft")), run.mode.lora),
                "num_processes": (accelerate.get("num_processes"), 1),
                "model_name_or_path": (resolved["model"].get("model_name_or_path"), str(setup.policy)),
                "reward_model_name_or_path": (resolved["script"].get("reward_model_name_or_path"), str(setup.reward)),
                "output_dir": (trainer.get("output_dir"), str(run.output_dir(setup)))}
    if on_gpu:
        expected.update({"use_cpu": (accelerate.get("use_cpu"), False),
                         "mixed_precision": (accelerate.get("mixed_precision"), "bf16"),
                         "DS_ACCELERATOR": (resolved["launch"]["env"].get("DS_ACCELERATOR"), None)})
    for key, value in run.set_values(setup).items():
        shown = [group[key] for group in groups if key in group]  # launch-only keys (plan_prompt_length) are not
        expected[key] = (shown[0] if shown else resolved["sources"].get(key), value if shown else "--set")
    return [f"{run.name}: {key} is {got!r} in the resolved run, expected {want!r}"
            for key, (got, want) in expected.items() if got != want]


def check_plan(run: Run, plan: dict[str, Any], setup: Setup) -> list[str]:
    """What `rlhf plan ALGO ... --json` must say for its numbers to be about the run measured."""
    if not plan["known"]:
        return [f"{run.name}: rlhf plan could not plan the run: {plan['why_unknown']}"]
    workload, column = plan["workload"], chosen_column(plan)
    expected = {"bytes per element (bf16)": (workload["element_bytes"], 2),
                "completion length": (workload["completion_length"], setup.completion),
                "prompt length": (workload["prompt_length"], setup.prompt_length),
                "gather": (column["gather"], run.mode.gather),
                "offload_optimizer": (column["offload_optimizer"], run.mode.offload_optimizer),
                "LoRA": (column["lora"], run.mode.lora),
                "GPU memory": (plan["gpu_memory"], setup.gpu_memory)}
    problems = [f"{run.name}: the plan's {key} is {got!r}, expected {want!r}"
                for key, (got, want) in expected.items() if got != want]
    try:
        plan_phases(column)
    except ValueError as error:
        problems.append(f"{run.name}: {error}")
    return problems


@dataclass
class Planned:
    run: Run
    setup: Setup
    resolved: dict[str, Any]
    plan: dict[str, Any]
    problems: list[str]


def plan_and_check(run: Run, setup: Setup, on_gpu: bool) -> Planned:
    resolved = json_output(run_timed([*run.command(setup), "--dry-run", "--json"], timeout=120).output)
    plan = json_output(run_timed(run.plan_command(setup), timeout=120).output)
    return Planned(run, setup, resolved, plan,
                   check_resolved(run, resolved, setup, on_gpu) + check_plan(run, plan, setup))


# -- measuring ----------------------------------------------------------------------------------------

@dataclass
class Measured:
    """One launched run: how it ended, what its rank recorded, its wall time."""

    planned: Planned
    status: str  # ok | failed | not run: why
    wall_s: float | None = None
    record: dict[str, Any] = field(default_factory=dict)  # ranks/rank-0.json
    error: str | None = None

    @property
    def calls(self) -> list[dict[str, Any]]:
        return (self.record.get("phase_memory") or {}).get("generation_calls") or []

    @property
    def phases(self) -> dict[str, dict[str, int]]:
        return (self.record.get("phase_memory") or {}).get("phases") or {}

    def seconds_per_step(self) -> float | None:
        """Median spacing of the generation calls (one per step in every algorithm here): the first step's
        warm-up before the first call is left out."""
        starts = [call["started_s"] for call in self.calls]
        steps = self.record.get("global_step") or 0
        if len(starts) < 2 or not steps:
            return None
        return statistics.median(b - a for a, b in zip(starts, starts[1:], strict=False)) * len(starts) / steps

    def generation_seconds(self) -> float | None:
        return statistics.median(call["seconds"] for call in self.calls) if self.calls else None

    def device_bytes(self, phase: str) -> int | None:
        """What the GPU held at the phase's peak: the allocator's reserved peak and what lies outside it."""
        peaks = self.phases.get(phase)
        return peaks["max_reserved_bytes"] + peaks["outside_allocator_bytes"] if peaks else None


def measure(planned: Planned, timeout: float) -> Measured:
    out = planned.run.output_dir(planned.setup)
    try:
        timed = run_timed(planned.run.command(planned.setup), env=RUN_ENV, timeout=timeout)
    except CommandFailed as error:  # a timeout too: CommandTimedOut
        return Measured(planned, "failed", error=str(error) + rank_error(out))
    record_file = out / "ranks" / "rank-0.json"
    if not record_file.exists():
        return Measured(planned, "failed", timed.seconds, error=f"{record_file} was not written")
    record = json.loads(record_file.read_text())
    for weights in out.glob("*.safetensors"):  # the saved 1B policy: 2 GB a run, never read here
        weights.unlink()
    measured = Measured(planned, "ok", timed.seconds, record)
    if not measured.calls:
        return Measured(planned, "failed", timed.seconds, record, "the rank recorded no generation call: "
                        "was RLHF_PROBE_CUDA_MEMORY=1 seen by the rank?")
    if not measured.phases:
        return Measured(planned, "failed", timed.seconds, record,
                        "the rank recorded no CUDA memory: it ran without CUDA")
    return measured


def rank_error(out: Path) -> str:
    """Why the ranks failed, as rlhf itself says it, where they left a record."""
    from rlhf_cli.launch.faults import PlanNeeds, explain
    from rlhf_cli.output.run_dir import RunDir

    failure = explain(RunDir(out), PlanNeeds())
    return f"\n{failure.line}" if failure else ""


# -- report -------------------------------------------------------------------------------------------

def gib(value: float | None) -> str:
    return "-" if value is None else f"{value / GIB:.2f}"


def percent(planned: float, measured: float | None) -> str:
    return "-" if not measured else f"{100 * (planned - measured) / measured:+.1f}"


PLAN_COLUMNS = ["run", "plan static GiB", "plan generation GiB", "plan training GiB", "plan peak GiB", "fits"]
TIME_COLUMNS = ["run", "status", "steps", "wall s", "s/step", "gen s/call", "gen tokens/s"]
MEMORY_COLUMNS = ["run", "load GiB", "gen allocated GiB", "gen device GiB", "train allocated GiB", "train device GiB",
                  "outside allocator GiB", "plan gen GiB", "plan train GiB", "plan peak GiB", "measured peak GiB",
                  "gen error %", "train error %", "plan error %"]


def plan_row(planned: Planned) -> list[str]:
    column = chosen_column(planned.plan)
    phases = plan_phases(column)
    return [planned.run.name, gib(phases["static"]), gib(phases["generation"]), gib(phases["training"]),
            gib(column["peak_gpu"]), "yes" if column["fits"] else "no"]


def time_row(measured: Measured) -> list[str]:
    per_step, per_call = measured.seconds_per_step(), measured.generation_seconds()
    workload = measured.planned.plan["workload"]
    tokens = workload["generation_batch"] * workload["completion_length"]
    return [measured.planned.run.name, measured.status, str(measured.record.get("global_step", "-")),
            "-" if measured.wall_s is None else f"{measured.wall_s:.0f}",
            "-" if per_step is None else f"{per_step:.2f}", "-" if per_call is None else f"{per_call:.2f}",
            "-" if not per_call else f"{tokens / per_call:.0f}"]


def memory_row(measured: Measured) -> list[str]:
    column = chosen_column(measured.planned.plan)
    plan = plan_phases(column)
    plan_gen, plan_train = plan["static"] + plan["generation"], plan["static"] + plan["training"]
    gen, train = measured.device_bytes("generation"), measured.device_bytes("train")
    phases = measured.phases
    peak = max((measured.device_bytes(phase) or 0 for phase in phases), default=0) or None

    def allocated(phase: str) -> int | None:
        return phases[phase]["max_allocated_bytes"] if phase in phases else None

    outside = max((p["outside_allocator_bytes"] for p in phases.values()), default=None)
    return [measured.planned.run.name, gib(allocated("load")), gib(allocated("generation")), gib(gen),
            gib(allocated("train")), gib(train), gib(outside), gib(plan_gen), gib(plan_train),
            gib(column["peak_gpu"]), gib(peak), percent(plan_gen, gen), percent(plan_train, train),
            percent(column["peak_gpu"], peak)]


def requirement_lines() -> list[str]:
    """rlhf's declared requirements against what is installed: `name version` and whether it is in range."""
    import tomllib
    from packaging.requirements import Requirement

    lines = []
    for text in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]:
        requirement = Requirement(text)
        try:
            version = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            lines.append(f"{requirement.name}: MISSING (needs {requirement.specifier})")
            continue
        inside = requirement.specifier.contains(version, prereleases=True)
        lines.append(f"{requirement.name} {version}"
                     + ("" if inside else f" (OUT OF rlhf's range {requirement.specifier})"))
    return lines


def environment() -> dict[str, Any]:
    """The machine and the versions that ran."""
    import torch

    gpus = nvidia_smi("name,memory.total,memory.used,driver_version")
    return {"gpu": ", ".join(f"{name} ({total} MiB, {used} MiB in use before the runs, driver {driver})"
                             for name, total, used, driver in gpus) or "none",
            "python": sys.version.split()[0], "torch": f"{torch.__version__} (CUDA {torch.version.cuda})",
            "packages": requirement_lines() + [f"{name} {version_of(name)}" for name in OTHER_PACKAGES]}


OTHER_PACKAGES = ("peft", "pydantic", "tokenizers", "huggingface-hub", "pyarrow")


def version_of(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def report(out: Path, setup: Setup, env: dict[str, Any], outcomes: list[Measured], skipped: list[str],
           show: bool = True) -> None:
    """Write gpu.md (tables and notes) and gpu.json (every number, every failure's output); `show`: print the
    tables too."""
    title = (f"rlhf on one GPU: bf16, ZeRO-3, 1 process; {setup.steps} steps per run, {setup.completion} "
             f"completion tokens, prompts of up to {setup.prompt_length} tokens")
    time_rows, memory_rows = [time_row(m) for m in outcomes], [memory_row(m) for m in outcomes if m.status == "ok"]
    if show:
        print_table(title, TIME_COLUMNS, time_rows)
        print_table("Peak memory per phase, measured and planned", MEMORY_COLUMNS, memory_rows)
    failures = [f"- `{m.planned.run.name}`: {m.status}" + (f": {m.error.strip().splitlines()[-1]}" if m.error else "")
                for m in outcomes if m.status != "ok"]
    text = "\n".join([
        f"# {title}", "",
        f"Machine: {env['gpu']}; Python {env['python']}, torch {env['torch']}. {env['models']}.", "",
        "Packages: " + "; ".join(env["packages"]) + ".", "",
        markdown_table(TIME_COLUMNS, time_rows),
        markdown_table(MEMORY_COLUMNS, memory_rows),
        *(["Runs that failed or did not run:", "", *failures, ""] if failures else []),
        *(["Left out: " + "; ".join(skipped) + ".", ""] if skipped else []),
        READING,
    ])
    write_markdown(out / "gpu.md", text)
    raw = {"environment": env, "setup": {k: str(v) for k, v in setup.__dict__.items()},
           "runs": [{"run": m.planned.run.name, "status": m.status, "wall_s": m.wall_s, "error": m.error,
                     "command": m.planned.run.command(setup), "plan": m.planned.plan, "rank_record": m.record}
                    for m in outcomes]}
    (out / "gpu.json").write_text(json.dumps(raw, indent=1) + "\n")


READING = """How to read it:
- s/step: median spacing of the generation calls, one per step (the first step's warm-up is left out);
  gen s/call: median wall time of a generation call, gathering and release included; gen tokens/s: the
  plan's generation batch x completion length / gen s/call.
- load, gen and train: the rank's phases (`rlhf_cli/rank/probes.py`, `PhaseMemory`): until the first generation,
  inside TRL's generation context, and between generations (scoring, reference, forward and backward,
  optimizer step). allocated: `torch.cuda.max_memory_allocated` in the phase; device: its
  `max_memory_reserved` plus what the GPU had in use beyond the allocator (CUDA context, NCCL, library
  workspaces: the outside allocator column).
- plan gen / plan train: `rlhf plan`'s rows that stay plus those of the phase; plan peak: its `peak per GPU`.
  Errors are (plan - measured) / measured against the device figures; measured peak: the largest of the three
  phases (the plan has no load phase: a load peak above the others is a gap in the plan)."""


def run_all(args: argparse.Namespace, setup: Setup, planned: list[Planned], skipped: list[str]) -> int:
    """Launch every checked run within the time budget, then report; 1 when a run failed."""
    if not nvidia_gpu_memory():
        print("no NVIDIA GPU here (nvidia-smi finds none): run with --dry-run, or on a GPU machine", file=sys.stderr)
        return 2
    # torch asks NVML whether there is a GPU: this process makes no CUDA context, which would count in every run.
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    counts = []
    for model, directory, role in ((POLICY, setup.policy, "policy"), (REWARD, setup.reward, "reward")):
        started = time.perf_counter()
        count, planned_count = write_weights(model, directory), planned[0].plan["models"][role]["params"]
        counts.append(f"{role} {directory.name}: {count / 1e6:.1f}M parameters (rlhf plan: {planned_count / 1e6:.1f}M)")
        print(f"{counts[-1]}, written in {time.perf_counter() - started:.0f} s", flush=True)
    env = {**environment(), "models": "; ".join(counts)}
    print(f"{env['gpu']}; torch {env['torch']}; " + "; ".join(env["packages"]), flush=True)
    deadline = time.monotonic() + args.budget_s
    rehearse_first(args.out, planned[0], setup, timeout=min(args.run_timeout_s, args.budget_s / 3))
    outcomes: list[Measured] = []
    for item in planned:
        left = deadline - time.monotonic()
        longest = max((m.wall_s for m in outcomes if m.wall_s), default=args.first_run_s)
        if left < longest:
            outcomes.append(Measured(item, f"not run: {left:.0f} s of the budget left, a run takes ~{longest:.0f}"))
            continue
        print(f"running {item.run.name} ...", flush=True)
        measured = measure(item, timeout=min(args.run_timeout_s, left))
        outcomes.append(measured)
        print(f"  {measured.status}" + (f" in {measured.wall_s:.0f} s" if measured.wall_s else "")
              + (f"\n{measured.error[-3000:]}" if measured.error else ""), flush=True)
        report(args.out, setup, env, outcomes, skipped, show=False)  # so far: kept if the whole command is killed
    report(args.out, setup, env, outcomes, skipped)
    return 1 if any(m.status == "failed" for m in outcomes) else 0


def rehearse_first(out: Path, item: Planned, setup: Setup, timeout: float) -> None:
    """`--rehearse` on the first run before any other: the plan checked on this GPU (its phases measured beside the
    plan's and a memory verdict, rlhf_cli/plan/measured.py) even when the runs after it do not finish. Its output
    goes into rehearsal.txt beside gpu.md."""
    print(f"rehearsing {item.run.name} ...", flush=True)
    try:
        done = run_timed([*item.run.command(setup), "--rehearse"], timeout=timeout)
        said = f"fits: exit 0 in {done.seconds:.0f} s\n{done.output}"
    except CommandFailed as failed:  # exit 1: a phase over the plan's memory; or a crash, or past the timeout
        said = str(failed)
    out.mkdir(parents=True, exist_ok=True)
    (out / "rehearsal.txt").write_text(f"{' '.join(item.run.command(setup))} --rehearse\n{said}\n")
    print(said[-3000:], flush=True)


def available_algorithms() -> tuple[list[Algorithm], list[str]]:
    """The algorithms this rlhf has, and a line for each optional one it lacks; a required one missing is an error."""
    algorithms, left_out = [], []
    for algorithm in ALGORITHMS:
        reason = missing_reason(algorithm)
        if reason is None:
            algorithms.append(algorithm)
        elif algorithm.optional:
            left_out.append(f"{algorithm.command}: {reason}")
        else:
            raise SystemExit(f"rlhf {algorithm.command}: {reason}")
    return algorithms, left_out


def selected(runs: list[Run], only: str) -> list[Run]:
    wanted = {name.strip() for name in only.split(",") if name.strip()}
    unknown = wanted - {run.name for run in runs}
    if unknown:
        raise SystemExit(f"--only: no run named {', '.join(sorted(unknown))}; runs: {', '.join(r.name for r in runs)}")
    return [run for run in runs if not wanted or run.name in wanted]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true",
                        help="build configs and commands, check them with rlhf's --dry-run and plan, launch nothing")
    parser.add_argument("--steps", type=int, default=3, help="training steps per run (one generation call each)")
    parser.add_argument("--completion-length", type=int, default=32)
    parser.add_argument("--only", default="", help="comma-separated runs to keep, e.g. rloo/gather,ppo/gather+offload")
    parser.add_argument("--gpu-memory", default=None,
                        help=f"for rlhf plan; default: nvidia-smi's, else the H200's {H200_MEMORY}")
    parser.add_argument("--budget-s", type=float, default=400,
                        help="seconds for all runs; a run that would not fit in what is left is not started")
    parser.add_argument("--run-timeout-s", type=float, default=240, help="a run still going after this is killed")
    parser.add_argument("--first-run-s", type=float, default=60, help="what a run is assumed to take before one ran")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where gpu.md and gpu.json go")
    parser.add_argument("--work-dir", type=Path, default=WORK / "gpu", help="models and runs (not in git)")
    args = parser.parse_args(argv)

    work, gpus = args.work_dir.resolve(), nvidia_gpu_memory()
    gpu_memory = parse_size(args.gpu_memory) if args.gpu_memory else gpus[0] if gpus else parse_size(H200_MEMORY)
    setup = Setup(write_config(POLICY, work / POLICY.directory_name),
                  write_config(REWARD, work / REWARD.directory_name), work / "runs", args.steps,
                  args.completion_length, longest_prompt_tokens(), gpu_memory)
    algorithms, left_out = available_algorithms()
    planned = [plan_and_check(run, setup, on_gpu=bool(gpus)) for run in selected(all_runs(algorithms), args.only)]
    problems = [problem for item in planned for problem in item.problems]
    for problem in problems:
        print(f"check failed: {problem}", file=sys.stderr)
    if problems:
        return 1
    print_table(f"Planned runs: bf16, ZeRO-3, 1 process, {gib(setup.gpu_memory)} GiB per GPU", PLAN_COLUMNS,
                [plan_row(item) for item in planned])
    for line in left_out:
        print(f"left out: {line}")
    if not args.dry_run:
        return run_all(args, setup, planned, left_out)
    for item in planned:
        print(" ".join(item.run.command(setup)))
    print(" ".join(planned[0].run.command(setup)) + " --rehearse  # first, on a GPU")
    print(f"{len(planned)} runs checked: flags resolved, bf16 on, plans known")
    return 0


if __name__ == "__main__":
    sys.exit(main())
