"""Every flag of the training commands and `rlhf plan`, declared once.

One row per flag: the parameter that holds it, its names, its help, the recipe key it sets (if it sets one
directly) and its help panel. The table builds the commands' signatures (Typer reads options from a signature,
so `command_signature` gives it one built from these rows), the flag -> recipe key mapping (`FLAGS`) and the
`--help` test. To add a flag that sets a recipe key, add a row with `key=`; nothing else needs to change.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Optional

import typer

LAUNCH = "Launch and ZeRO-3"
LORA = "LoRA"
SHORTCUTS = "Shortcuts for recipe keys"


# A boolean flag takes no value, so its help shows none: Typer 0.29 writes `<bool>` after it (which reads as if
# it took one) unless its metavar is empty, Typer's public way to leave the column blank.
NO_VALUE = ""


@dataclass(frozen=True)
class Flag:
    """One command-line flag. Value flags arrive as text and are checked by the config layer against the recipe
    key they set, so that a mistyped flag is one more line in the report of every problem, not the only one."""

    parameter: str  # the name the command reads it by
    names: tuple[str, ...]  # as people type it; the first is the one problems name
    help: str
    key: str | None = None  # the recipe key it sets as given; None: the command reads it (switches, --set, ...)
    panel: str | None = None
    kind: Any = Optional[str]
    default: Any = None
    metavar: str | None = None
    show_default: bool = True
    complete: Callable[[], list[str]] | None = None
    repeatable: bool = False  # every occurrence counts (--set); any other flag given twice is refused
    # An on/off pair (`--lora` / `--no-lora`): the recipe key both flags set, true from the `on` one (any value it
    # takes is read by the command: `--vllm colocate`), false from the other; giving both is a contradiction.
    switch: str | None = None
    on: bool = True

    def parameter_of_command(self) -> inspect.Parameter:
        """The flag as Typer reads it: every occurrence, a list of values or a switch's count, since click keeps
        only the last one of an option given twice; `given_once` turns them back into one value."""
        if self.kind is bool:
            option = typer.Option(*self.names, help=self.help, rich_help_panel=self.panel, metavar=NO_VALUE,
                                  show_default=False, count=True)
            return inspect.Parameter(self.parameter, inspect.Parameter.KEYWORD_ONLY, default=0,
                                     annotation=Annotated[int, option])
        kind = self.kind if self.repeatable else Optional[list[_value_type(self.kind)]]  # type: ignore[misc]
        option = typer.Option(*self.names, help=self.help, rich_help_panel=self.panel, metavar=self.metavar,
                              show_default=self.show_default, autocompletion=self.complete)
        return inspect.Parameter(self.parameter, inspect.Parameter.KEYWORD_ONLY, default=self.default,
                                 annotation=Annotated[kind, option])


def _value_type(kind: Any) -> type:
    """`str` of `Optional[str]`: the type of one occurrence's value."""
    return next(arg for arg in getattr(kind, "__args__", (kind,)) if arg is not type(None))


def _offload_devices() -> list[str]:
    from rlhf_cli.config.fields import OFFLOAD_DEVICES  # read when completing, not for every command

    return list(OFFLOAD_DEVICES)


# In the order `--help` lists them.
TABLE: tuple[Flag, ...] = (
    Flag("recipe", ("--recipe", "-r"), metavar="PATH",
         help="YAML recipe (TRL-style flat keys), or a bundled one like rloo/smoke."),
    # Two flags, not Typer's `--gather/--no-gather`, so that giving both is an error instead of the last one
    # winning. `--gather auto`: Typer flags take no value, so `auto` arrives as an extra argument (`ctx.args`).
    Flag("gather", ("--gather",), panel=LAUNCH, kind=bool, default=False, show_default=False,
         switch="ds3_gather_for_generation",
         help="Gather the whole policy on every GPU to generate (fast, needs memory). [bold]--gather auto[/]: "
              "gather if the memory plan says it fits, else the largest gather budget that fits. Default: the "
              "recipe's, else TRL's (gather)."),
    Flag("no_gather", ("--no-gather",), panel=LAUNCH, kind=bool, default=False, show_default=False,
         switch="ds3_gather_for_generation", on=False,
         help="Generate from ZeRO-3 shards (fits, slower): TRL's ds3_gather_for_generation=false."),
    Flag("gather_budget", ("--gather-budget",), key="gather_budget", panel=LAUNCH, metavar="SIZE|FRACTION",
         show_default=False,
         help="Between the two: gather this share of the policy (0.5) or this much of it per GPU (2GiB) once per "
              "generation call, as whole layers, and fetch the rest per token. --gather is 1, --no-gather 0."),
    Flag("vllm", ("--vllm",), key="vllm_mode", panel=LAUNCH, metavar="colocate|server", show_default=False,
         switch="use_vllm",
         help="Generate with vLLM (use_vllm, vllm_mode): colocate runs it in every training process, refreshed from "
              "the policy after each update within the gather choice's memory; server talks to a vLLM server."),
    Flag("no_vllm", ("--no-vllm",), panel=LAUNCH, kind=bool, default=False, show_default=False, switch="use_vllm",
         on=False,
         help="Generate with the policy's own generate()."),
    Flag("offload_optimizer", ("--offload-optimizer",), key="offload_optimizer", panel=LAUNCH,
         metavar="none|cpu|nvme", show_default=False, complete=_offload_devices,
         help="Keep optimizer states on the GPU (none), in CPU memory or on NVMe."),
    Flag("offload_params", ("--offload-params",), key="offload_params", panel=LAUNCH, metavar="none|cpu|nvme",
         show_default=False, complete=_offload_devices,
         help="Keep ZeRO-3 parameter shards on the GPU (none), in CPU memory or on NVMe."),
    Flag("nvme_path", ("--nvme-path",), key="nvme_path", panel=LAUNCH, metavar="DIR",
         help="Local NVMe directory for nvme offload."),
    Flag("num_processes", ("--num-processes",), key="num_processes", panel=LAUNCH, metavar="N", show_default=False,
         help="Processes (GPUs) in total. Default: the recipe's, else the accelerate config's."),
    Flag("num_gpus", ("--num-gpus",), key="num_gpus", panel=LAUNCH, metavar="N", show_default=False,
         help="GPUs per machine: num_processes = N x machines. Default: num_processes."),
    Flag("gpu_memory", ("--gpu-memory",), key="gpu_memory", panel=LAUNCH, metavar="SIZE",
         help="Memory of each GPU for the memory plan (24GiB, 24GB, 24576MiB, bytes). Default: from nvidia-smi."),
    Flag("gpu", ("--gpu",), key="gpu", panel=LAUNCH, metavar="NAME",
         help="The GPU for the time plan: a10, l4, l40s, rtx3090, rtx4090, a100-40gb, a100-80gb, a100-pcie, h100, "
              "h100-pcie, h200, b200. Default: from nvidia-smi."),
    Flag("interconnect", ("--interconnect",), key="interconnect", panel=LAUNCH, metavar="nvlink|pcie|RATE",
         help="How the GPUs of a machine reach each other, for the time plan: nvlink, pcie, or a rate each way per "
              "GPU (50GB). Default: the GPU's usual link."),
    Flag("network", ("--network",), key="network", panel=LAUNCH, metavar="RATE",
         help="The link between machines for the time plan: a rate each way per GPU (25GB: one 200 Gb/s port per "
              "GPU). Default: by GPU class (DGX-style InfiniBand, a server's or workstation's Ethernet)."),
    Flag("hardware_file", ("--hardware",), key="hardware_file", panel=LAUNCH, metavar="FILE",
         help="A YAML file describing a GPU the table lacks: name, bf16_tflops, memory_bandwidth_gbs, "
              "interconnect, interconnect_gbs, host_gbs."),
    Flag("num_machines", ("--num-machines",), key="num_machines", panel=LAUNCH, metavar="N", show_default=False,
         help="Machines in the job. Default: the recipe's, SLURM's or torchrun's, else 1."),
    Flag("machine_rank", ("--machine-rank",), key="machine_rank", panel=LAUNCH, metavar="N", show_default=False,
         help="This machine's rank (0 starts the rendezvous). Default: from SLURM or torchrun."),
    Flag("main_process_ip", ("--main-process-ip",), key="main_process_ip", panel=LAUNCH, metavar="HOST",
         help="Address of machine rank 0. Default: the first SLURM host, or MASTER_ADDR."),
    Flag("main_process_port", ("--main-process-port",), key="main_process_port", panel=LAUNCH, metavar="PORT",
         show_default=False,
         help="Rendezvous port on machine rank 0. Default: MASTER_PORT, else free (1 machine) or 29500."),
    Flag("stall_timeout", ("--stall-timeout",), key="stall_timeout", panel=LAUNCH, kind=Optional[float],
         metavar="SECONDS", show_default=False,
         help="Stop the job, naming the stalled rank and writing every rank's stack, when no rank made progress "
              "(or one sent no heartbeat) for this long; loading and saving do not count. Default: 120."),
    Flag("accelerate_config", ("--accelerate-config",), key="accelerate_config", panel=LAUNCH, metavar="PATH",
         help="Start from your accelerate config instead of the bundled ZeRO-3 one; flags still apply."),
    Flag("lora", ("--lora",), panel=LORA, kind=bool, default=False, show_default=False, switch="use_peft",
         help="Train LoRA adapters on the policy (use_peft): frozen base weights, optimizer states for the adapters "
              "only, and the policy with adapters off as the reference. More: --set lora_alpha=32 ..."),
    Flag("no_lora", ("--no-lora",), panel=LORA, kind=bool, default=False, show_default=False, switch="use_peft",
         on=False,
         help="Full fine-tuning, whatever the recipe says."),
    Flag("lora_r", ("--lora-r",), key="lora_r", panel=LORA, metavar="N", show_default=False,
         help="LoRA rank (lora_r). Default: 16."),
    Flag("merge_adapter", ("--merge-adapter",), panel=LORA, kind=bool, default=False, show_default=False,
         help="With --lora: also save the policy with its adapter merged in, to OUTPUT_DIR/merged (merge_adapter)."),
    Flag("model", ("--model",), key="model_name_or_path", panel=SHORTCUTS, metavar="ID|DIR",
         help="Policy model (model_name_or_path)."),
    Flag("reward_model", ("--reward-model",), key="reward_model_name_or_path", panel=SHORTCUTS, metavar="ID|DIR",
         help="Reward model, a sequence classifier (reward_model_name_or_path)."),
    Flag("dataset", ("--dataset",), key="dataset_name", panel=SHORTCUTS, metavar="ID|FILE",
         help="Hub dataset or local .json/.jsonl/.parquet/.csv file (dataset_name)."),
    Flag("output_dir", ("--output-dir", "-o"), key="output_dir", panel=SHORTCUTS, metavar="DIR",
         help="Where the run, its record and the model go (output_dir). Default: runs/ALGO-TIME."),
    Flag("max_steps", ("--max-steps",), key="max_steps", panel=SHORTCUTS, metavar="N", show_default=False,
         help="Training steps (max_steps)."),
    Flag("seed", ("--seed",), key="seed", panel=SHORTCUTS, metavar="N", show_default=False,
         help="Random seed (seed)."),
    Flag("set_", ("--set", "-s"), kind=Optional[list[str]], metavar="KEY=VALUE", show_default=False, repeatable=True,
         help="Any other recipe key; VALUE is read as YAML (3e-6, true, \\[a, b]). Repeatable."),
    Flag("dry_run", ("--dry-run",), kind=bool, default=False,
         help="Print the resolved run (trainer, accelerate config, launch command) and exit."),
    Flag("rehearse", ("--rehearse",), kind=bool, default=False,
         help="First one step at the worst case the run will meet (its longest prompts, full-length completions, a "
              "checkpoint saved) in OUTPUT_DIR.rehearsal, then its phases beside the plan and a verdict: exit 0 if "
              "its peak memory fits --gpu-memory (or the plan's), 1 naming the phase that went over."),
    Flag("json_", ("--json",), kind=bool, default=False,
         help="With --dry-run or rlhf plan: print it as one JSON object."),
    Flag("overwrite", ("--overwrite",), kind=bool, default=False,
         help="Start again in an output dir that holds a run: first removes what rlhf wrote there, and only that."),
    Flag("quiet", ("--quiet", "-q"), kind=bool, default=False,
         help="Errors only: no header, progress or summary; other ranks silent."),
    Flag("verbose", ("--verbose", "-v"), kind=bool, default=False,
         help="Everything every rank and library prints, as well as rlhf's own output."),
    Flag("resume", ("--resume",), key="resume_from_checkpoint", panel=SHORTCUTS, metavar="CHECKPOINT|auto",
         help="Continue from a checkpoint directory, or `auto`: the newest complete one in --output-dir, if any."),
)

# recipe key -> (the flag as people type it, the parameter that holds it)
FLAGS = {flag.key: (flag.names[0], flag.parameter) for flag in TABLE if flag.key is not None}
# recipe key -> its (on, off) pair of flags
SWITCHES = {key: tuple(next(flag for flag in TABLE if flag.switch == key and flag.on is on) for on in (True, False))
            for key in dict.fromkeys(flag.switch for flag in TABLE if flag.switch)}


def contradiction(one: str, other: str) -> str:
    """The one message for two flags that cannot both be given."""
    return f"{one} and {other} contradict each other; keep one"


def switch_settings(options: dict[str, Any]) -> tuple[dict[str, tuple[str, bool]], list[str]]:
    """The recipe keys the on/off pairs given set, as (flag as typed, value), and a contradiction for each pair
    given both ways."""
    settings, problems = {}, []
    for key, (on, off) in SWITCHES.items():
        given_on = options.get(on.parameter) not in (None, False, 0)
        if given_on and options.get(off.parameter):
            problems.append(contradiction(on.names[0], off.names[0]))
        elif given_on or options.get(off.parameter):
            settings[key] = (on.names[0], True) if given_on else (off.names[0], False)
    return settings, problems


def given_once(options: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The command's options as one value each (a switch: on or off), and a problem for each flag given more than
    once: with the last one silently winning, `--max-steps 1 --max-steps 2` or `-r a.yaml -r b.yaml` would run
    something the user did not read back."""
    values, problems = dict(options), []
    for flag in TABLE:
        given = options.get(flag.parameter)
        if flag.repeatable or given is None:
            continue
        count = given if flag.kind is bool else len(given)
        if count > 1:
            shown = "" if flag.kind is bool else f" ({', '.join(str(value) for value in given)})"
            problems.append(f"{' / '.join(flag.names)} is given {count} times{shown}; give it once"
                            f"{REPEAT_HINTS.get(flag.parameter, '')}")
        values[flag.parameter] = bool(count) if flag.kind is bool else given[-1] if given else None
    return values, problems


# What to do instead of repeating a flag, where giving it once is not all there is to say.
REPEAT_HINTS = {"recipe": ": a run reads one recipe; copy the keys of the other into it, or give them with --set"}


def command_signature() -> inspect.Signature:
    """`(ctx, --recipe ..., --resume ...)`: what Typer builds a training command's options from."""
    context = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)
    return inspect.Signature([context, *(flag.parameter_of_command() for flag in TABLE)], return_annotation=None)
