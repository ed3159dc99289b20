"""The training commands and `rlhf plan`. They only parse flags, hand them to the config layer and print."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from rlhf_cli.cli.output import (print_header, print_notes, print_outcome, print_plan_compact, print_plan_table,
                                 print_run_human, print_run_json)
from rlhf_cli.config.fields import OFFLOAD_DEVICES

if TYPE_CHECKING:
    from rlhf_cli.config.resolve import ResolvedRun


LAUNCH = "Launch and ZeRO-3"
LORA = "LoRA"
SHORTCUTS = "Shortcuts for recipe keys"

RecipeOpt = Annotated[Optional[str], typer.Option(
    "--recipe", "-r", metavar="PATH", help="YAML recipe (TRL-style flat keys), or a bundled one like rloo/smoke.")]
# Two flags, not Typer's `--gather/--no-gather`, so that giving both is an error instead of the last one winning.
GatherOpt = Annotated[bool, typer.Option(
    "--gather", rich_help_panel=LAUNCH, show_default=False,
    help="Gather the whole policy on every GPU to generate (fast, needs memory). [bold]--gather auto[/]: gather "
         "if the memory plan says it fits, else the largest gather budget that fits. Default: the recipe's, else "
         "TRL's (gather).")]
NoGatherOpt = Annotated[bool, typer.Option(
    "--no-gather", rich_help_panel=LAUNCH, show_default=False,
    help="Generate from ZeRO-3 shards (fits, slower): TRL's ds3_gather_for_generation=false.")]
GatherBudgetOpt = Annotated[Optional[str], typer.Option(
    "--gather-budget", metavar="SIZE|FRACTION", rich_help_panel=LAUNCH, show_default=False,
    help="Between the two: gather this share of the policy (0.5) or this much of it per GPU (2GiB) once per "
         "generation call, as whole layers, and fetch the rest per token. --gather is 1, --no-gather 0.")]
VllmOpt = Annotated[Optional[str], typer.Option(
    "--vllm", metavar="colocate|server", rich_help_panel=LAUNCH, show_default=False,
    help="Generate with vLLM (use_vllm, vllm_mode): colocate runs it in every training process, refreshed from "
         "the policy after each update within the gather choice's memory; server talks to a vLLM server.")]
NoVllmOpt = Annotated[bool, typer.Option(
    "--no-vllm", rich_help_panel=LAUNCH, show_default=False, help="Generate with the policy's own generate().")]
# `--gather auto`: Typer flags take no value, so `auto` arrives as an extra argument (`ctx.args`); the
# commands are registered with EXTRA_ARGS to allow it.
EXTRA_ARGS = {"allow_extra_args": True}
# Numbers and choices arrive as text and are checked by the config layer against the recipe key they set, so
# that a mistyped flag is one more line in the report of every problem, not the only one.
OffloadOptimizerOpt = Annotated[Optional[str], typer.Option(
    "--offload-optimizer", metavar="none|cpu|nvme", rich_help_panel=LAUNCH, show_default=False,
    autocompletion=lambda: list(OFFLOAD_DEVICES),
    help="Keep optimizer states on the GPU (none), in CPU memory or on NVMe.")]
OffloadParamsOpt = Annotated[Optional[str], typer.Option(
    "--offload-params", metavar="none|cpu|nvme", rich_help_panel=LAUNCH, show_default=False,
    autocompletion=lambda: list(OFFLOAD_DEVICES),
    help="Keep ZeRO-3 parameter shards on the GPU (none), in CPU memory or on NVMe.")]
NvmePathOpt = Annotated[Optional[str], typer.Option(
    "--nvme-path", metavar="DIR", rich_help_panel=LAUNCH, help="Local NVMe directory for nvme offload.")]
NumProcessesOpt = Annotated[Optional[str], typer.Option(
    "--num-processes", metavar="N", rich_help_panel=LAUNCH, show_default=False,
    help="Processes (GPUs) in total. Default: the recipe's, else the accelerate config's.")]
NumGpusOpt = Annotated[Optional[str], typer.Option(
    "--num-gpus", metavar="N", rich_help_panel=LAUNCH, show_default=False,
    help="GPUs per machine: num_processes = N x machines. Default: num_processes.")]
GpuMemoryOpt = Annotated[Optional[str], typer.Option(
    "--gpu-memory", metavar="SIZE", rich_help_panel=LAUNCH,
    help="Memory of each GPU for the memory plan (24GiB, 24GB, 24576MiB, bytes). Default: from nvidia-smi.")]
NumMachinesOpt = Annotated[Optional[str], typer.Option(
    "--num-machines", metavar="N", rich_help_panel=LAUNCH, show_default=False,
    help="Machines in the job. Default: the recipe's, SLURM's or torchrun's, else 1.")]
MachineRankOpt = Annotated[Optional[str], typer.Option(
    "--machine-rank", metavar="N", rich_help_panel=LAUNCH, show_default=False,
    help="This machine's rank (0 starts the rendezvous). Default: from SLURM or torchrun.")]
MainProcessIpOpt = Annotated[Optional[str], typer.Option(
    "--main-process-ip", metavar="HOST", rich_help_panel=LAUNCH,
    help="Address of machine rank 0. Default: the first SLURM host, or MASTER_ADDR.")]
MainProcessPortOpt = Annotated[Optional[str], typer.Option(
    "--main-process-port", metavar="PORT", rich_help_panel=LAUNCH, show_default=False,
    help="Rendezvous port on machine rank 0. Default: MASTER_PORT, else free (1 machine) or 29500.")]
StallTimeoutOpt = Annotated[Optional[float], typer.Option(
    "--stall-timeout", metavar="SECONDS", rich_help_panel=LAUNCH, show_default=False,
    help="Stop the job, naming the stalled rank and writing every rank's stack, when no rank made progress (or one "
         "sent no heartbeat) for this long; loading and saving do not count. Default: 120.")]
AccelerateConfigOpt = Annotated[Optional[str], typer.Option(
    "--accelerate-config", metavar="PATH", rich_help_panel=LAUNCH,
    help="Start from your accelerate config instead of the bundled ZeRO-3 one; flags still apply.")]
LoraOpt = Annotated[bool, typer.Option(
    "--lora", rich_help_panel=LORA, show_default=False,
    help="Train LoRA adapters on the policy (use_peft): frozen base weights, optimizer states for the adapters "
         "only, and the policy with adapters off as the reference. More: --set lora_alpha=32 ...")]
NoLoraOpt = Annotated[bool, typer.Option(
    "--no-lora", rich_help_panel=LORA, show_default=False, help="Full fine-tuning, whatever the recipe says.")]
LoraROpt = Annotated[Optional[str], typer.Option(
    "--lora-r", metavar="N", rich_help_panel=LORA, show_default=False, help="LoRA rank (lora_r). Default: 16.")]
MergeAdapterOpt = Annotated[bool, typer.Option(
    "--merge-adapter", rich_help_panel=LORA, show_default=False,
    help="With --lora: also save the policy with its adapter merged in, to OUTPUT_DIR/merged (merge_adapter).")]
ModelOpt = Annotated[Optional[str], typer.Option(
    "--model", metavar="ID|DIR", rich_help_panel=SHORTCUTS, help="Policy model (model_name_or_path).")]
RewardModelOpt = Annotated[Optional[str], typer.Option(
    "--reward-model", metavar="ID|DIR", rich_help_panel=SHORTCUTS,
    help="Reward model, a sequence classifier (reward_model_name_or_path).")]
DatasetOpt = Annotated[Optional[str], typer.Option(
    "--dataset", metavar="ID|FILE", rich_help_panel=SHORTCUTS,
    help="Hub dataset or local .json/.jsonl/.parquet/.csv file (dataset_name).")]
OutputDirOpt = Annotated[Optional[str], typer.Option(
    "--output-dir", "-o", metavar="DIR", rich_help_panel=SHORTCUTS,
    help="Where the run, its record and the model go (output_dir). Default: runs/ALGO-TIME.")]
MaxStepsOpt = Annotated[Optional[str], typer.Option(
    "--max-steps", metavar="N", rich_help_panel=SHORTCUTS, show_default=False, help="Training steps (max_steps).")]
SeedOpt = Annotated[Optional[str], typer.Option(
    "--seed", metavar="N", rich_help_panel=SHORTCUTS, show_default=False, help="Random seed (seed).")]
SetOpt = Annotated[Optional[list[str]], typer.Option(
    "--set", "-s", metavar="KEY=VALUE", show_default=False,
    help="Any other recipe key; VALUE is read as YAML (3e-6, true, \\[a, b]). Repeatable.")]
DryRunOpt = Annotated[bool, typer.Option(
    "--dry-run", help="Print the resolved run (trainer, accelerate config, launch command) and exit.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="With --dry-run or rlhf plan: print it as one JSON object.")]
QuietOpt = Annotated[bool, typer.Option(
    "--quiet", "-q", help="Errors only: no header, progress or summary; other ranks silent.")]
VerboseOpt = Annotated[bool, typer.Option(
    "--verbose", "-v", help="Everything every rank and library prints, as well as rlhf's own output.")]
OverwriteOpt = Annotated[bool, typer.Option("--overwrite", help="Reuse an output dir that already holds a run.")]
ResumeOpt = Annotated[Optional[str], typer.Option(
    "--resume", metavar="CHECKPOINT|auto", rich_help_panel=SHORTCUTS,
    help="Continue from a checkpoint directory, or `auto`: the newest complete one in --output-dir, if any.")]


# recipe key -> (the flag as people type it, the parameter that holds it)
FLAGS = {
    "model_name_or_path": ("--model", "model"), "reward_model_name_or_path": ("--reward-model", "reward_model"),
    "dataset_name": ("--dataset", "dataset"), "output_dir": ("--output-dir", "output_dir"),
    "max_steps": ("--max-steps", "max_steps"), "seed": ("--seed", "seed"),
    "gather_budget": ("--gather-budget", "gather_budget"),
    "offload_optimizer": ("--offload-optimizer", "offload_optimizer"),
    "offload_params": ("--offload-params", "offload_params"), "nvme_path": ("--nvme-path", "nvme_path"),
    "num_processes": ("--num-processes", "num_processes"), "num_gpus": ("--num-gpus", "num_gpus"),
    "gpu_memory": ("--gpu-memory", "gpu_memory"), "num_machines": ("--num-machines", "num_machines"),
    "machine_rank": ("--machine-rank", "machine_rank"), "main_process_ip": ("--main-process-ip", "main_process_ip"),
    "main_process_port": ("--main-process-port", "main_process_port"),
    "accelerate_config": ("--accelerate-config", "accelerate_config"),
    "stall_timeout": ("--stall-timeout", "stall_timeout"),
    "resume_from_checkpoint": ("--resume", "resume"), "lora_r": ("--lora-r", "lora_r"),
}


def train(
    ctx: typer.Context,
    recipe: RecipeOpt = None,
    gather: GatherOpt = False,
    no_gather: NoGatherOpt = False,
    gather_budget: GatherBudgetOpt = None,
    vllm: VllmOpt = None,
    no_vllm: NoVllmOpt = False,
    offload_optimizer: OffloadOptimizerOpt = None,
    offload_params: OffloadParamsOpt = None,
    nvme_path: NvmePathOpt = None,
    num_processes: NumProcessesOpt = None,
    num_gpus: NumGpusOpt = None,
    gpu_memory: GpuMemoryOpt = None,
    num_machines: NumMachinesOpt = None,
    machine_rank: MachineRankOpt = None,
    main_process_ip: MainProcessIpOpt = None,
    main_process_port: MainProcessPortOpt = None,
    stall_timeout: StallTimeoutOpt = None,
    accelerate_config: AccelerateConfigOpt = None,
    lora: LoraOpt = False,
    no_lora: NoLoraOpt = False,
    lora_r: LoraROpt = None,
    merge_adapter: MergeAdapterOpt = False,
    model: ModelOpt = None,
    reward_model: RewardModelOpt = None,
    dataset: DatasetOpt = None,
    output_dir: OutputDirOpt = None,
    max_steps: MaxStepsOpt = None,
    seed: SeedOpt = None,
    set_: SetOpt = None,
    dry_run: DryRunOpt = False,
    json_: JsonOpt = False,
    overwrite: OverwriteOpt = False,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
    resume: ResumeOpt = None,
) -> None:
    """`rlhf ppo|rloo|online-dpo|...`: the command name picks the algorithm."""
    options = dict(locals())
    from rlhf_cli.launch.faults import PlanNeeds, space_warning
    from rlhf_cli.plan.estimate import planned

    run, plan = planned(_resolve(ctx, options, planning=False))
    low_space = space_warning(run.output_dir, plan.checkpoint_bytes)
    run = run.with_note(low_space) if low_space else run
    if dry_run:
        print_plan_compact(plan)
        print_run_json(run, plan) if json_ else print_run_human(run)
        return
    if not quiet:
        print_notes(run)
        print_header(run, plan)
    from rlhf_cli.launch.runner import launch

    needs = PlanNeeds(plan.chosen.cpu_per_machine if plan.chosen else None, plan.checkpoint_bytes)
    outcome = launch(run, verbosity="quiet" if quiet else "verbose" if verbose else "normal", needs=needs)
    print_outcome(outcome, run, quiet)
    raise typer.Exit(outcome.exit_code)


def plan(ctx: typer.Context, **options: Any) -> None:
    """`rlhf plan ALGO`: the run's memory plan for every gather/offload choice; nothing is started or written.

    It takes every option of `rlhf ALGO`, so that any training command line is planned by inserting `plan`; the
    options that only decide how a run starts (--resume, --overwrite, --dry-run, -q, -v) change nothing here.
    """
    from rlhf_cli.plan.estimate import plan_run

    run = _resolve(ctx, options, planning=True)
    plan = plan_run(run)
    print_plan_table(run, plan, as_json=options["json_"])
    print_notes(run)


# Typer reads a command's options from its signature.
plan.__signature__ = inspect.signature(train, eval_str=True)  # type: ignore[attr-defined]


def _resolve(ctx: typer.Context, options: dict[str, Any], planning: bool) -> ResolvedRun:
    from rlhf_cli.config.resolve import RunRequest, resolve

    flags = {key: (flag, options[parameter]) for key, (flag, parameter) in FLAGS.items()
             if options.get(parameter) is not None}
    problems = _flag_problems(options, planning)
    gather = _gather_flag(options["gather"], options["no_gather"], ctx.args, problems)
    if gather is not None:
        flags["ds3_gather_for_generation"] = gather
    if options["vllm"] is not None and options["no_vllm"]:
        problems.append("--vllm and --no-vllm contradict each other; keep one")
    elif options["vllm"] is not None:
        flags["use_vllm"] = ("--vllm", True)
        flags["vllm_mode"] = ("--vllm", options["vllm"])
    elif options["no_vllm"]:
        flags["use_vllm"] = ("--no-vllm", False)
    if options["lora"] and options["no_lora"]:
        problems.append("--lora and --no-lora contradict each other; keep one")
    elif options["lora"] or options["no_lora"]:
        flags["use_peft"] = ("--lora", True) if options["lora"] else ("--no-lora", False)
    if options["merge_adapter"]:
        flags["merge_adapter"] = ("--merge-adapter", True)
    algorithm = ctx.info_name.replace("-", "_")
    return resolve(RunRequest(algorithm, options["recipe"], flags, tuple(options["set_"] or ()),
                              options.get("overwrite", False), planning=planning, problems=tuple(problems)))


def _flag_problems(options: dict[str, Any], planning: bool) -> list[str]:
    """Flags that contradict each other; reported with every other problem of the run."""
    problems = []
    if options["json_"] and not options["dry_run"] and not planning:
        problems.append("--json goes with --dry-run (or rlhf plan); add --dry-run or drop --json")
    if options["quiet"] and options["verbose"]:
        problems.append("--quiet and --verbose contradict each other; keep one")
    return problems


def _gather_flag(gather: bool, no_gather: bool, extra: list[str], problems: list[str]) -> tuple[str, Any] | None:
    """The flag as typed and its value: --gather, --no-gather, or --gather auto; any other word is a problem."""
    if gather and no_gather:
        problems.append("--gather and --no-gather contradict each other; keep one")
        return None
    if gather and extra == ["auto"]:
        return ("--gather auto", "auto")
    if extra:
        hint = "; did you mean --gather auto?" if "auto" in extra and not gather else ""
        problems.append(f"unexpected argument {' '.join(extra)!r}{hint}")
        return None
    if gather or no_gather:
        return ("--gather", True) if gather else ("--no-gather", False)
    return None
