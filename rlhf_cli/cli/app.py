"""The `rlhf` command: registers the subcommands; each lives in its own module."""

from __future__ import annotations

from typing import Annotated

import typer

from rlhf_cli import __version__
from rlhf_cli.cli import doctor, init, recipes, report
from rlhf_cli.cli.train import EXTRA_ARGS, train

app = typer.Typer(
    name="rlhf",
    help="Launch PPO, RLOO and online DPO under DeepSpeed ZeRO-3, with gather and offload as flags.",
    no_args_is_help=True,
    add_completion=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    rich_markup_mode="rich",
)


def _version(value: bool) -> None:
    if value:
        print(f"rlhf {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """Set RLHF_DEBUG=1 to see tracebacks for errors."""


TRAIN_COMMANDS = {
    "ppo": ("Train with PPO (rlhf's own trainer): a value model, GAE and a per-token KL penalty.",
            "rlhf ppo -r ppo/smoke --no-gather"),
    "rloo": ("Train with RLOO (TRL's RLOOTrainer): several completions per prompt, leave-one-out baseline.",
             "rlhf rloo -r rloo/smoke --no-gather"),
    "online-dpo": ("Train with online DPO (TRL's OnlineDPOTrainer): two completions per prompt, ranked by the reward.",
                   "rlhf online-dpo -r online_dpo/smoke --offload-optimizer cpu --dry-run"),
}

for _name, (_help, _example) in TRAIN_COMMANDS.items():
    app.command(_name, help=_help, epilog=f"Example: {_example}", context_settings=EXTRA_ARGS)(train)

plan_app = typer.Typer(
    name="plan", no_args_is_help=True,
    help="Will it fit? Per-GPU memory of a run for every gather/offload choice, before anything starts.")
for _name in TRAIN_COMMANDS:
    plan_app.command(_name, help=f"Plan `rlhf {_name}`: the same flags, nothing is started.",
                     context_settings=EXTRA_ARGS,
                     epilog=f"Example: rlhf plan {_name} -r {_name.replace('-', '_')}/pythia-12b-descriptiveness "
                            "--gpu-memory 24GiB --num-gpus 4")(train)
app.add_typer(plan_app)


for _command, _example in ((recipes.recipes, recipes.EXAMPLE), (init.init, init.EXAMPLE),
                          (doctor.doctor, doctor.EXAMPLE), (report.report, report.EXAMPLE)):
    app.command(epilog=f"Example: {_example}")(_command)


def main() -> None:
    app()
