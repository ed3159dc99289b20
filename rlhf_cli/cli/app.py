"""The `rlhf` command: registers the subcommands; each lives in its own module."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from rlhf_cli import __version__
from rlhf_cli.algorithms import ALGORITHMS
from rlhf_cli.cli import doctor, init, recipes, report, vllm_serve
from rlhf_cli.cli.flags import NO_VALUE
from rlhf_cli.cli.train import EXTRA_ARGS, plan, train
from rlhf_cli.generation.engines import VLLM_MODE_KEY

# Click leaves an absent `--help` or completion flag None, and Typer 0.29 checks a None flag's value through a
# pydantic validator it builds on first use: pydantic's import is a fifth of a subcommand's `--help`. A default
# of False, through click's public `default_map`, is a flag's value as it is and skips that.
ABSENT_FLAGS = {"help": False, "install_completion": False, "show_completion": False}

app = typer.Typer(
    name="rlhf",
    help="Launch PPO, RLOO, online DPO and GRPO under DeepSpeed ZeRO-3, with gather and offload as flags.",
    no_args_is_help=True,
    add_completion=True,
    context_settings={"help_option_names": ["-h", "--help"],
                      "default_map": {**ABSENT_FLAGS, "plan": ABSENT_FLAGS, "vllm-serve": ABSENT_FLAGS}},
    rich_markup_mode="rich",
)


def _version(value: bool) -> None:
    if value:
        print(f"rlhf {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[bool, typer.Option("--version", metavar=NO_VALUE, callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """Set RLHF_DEBUG=1 (or true, yes) to see tracebacks for errors."""


for _entry in ALGORITHMS.values():
    app.command(_entry.command, help=_entry.summary, epilog=f"Example: {_entry.example}",
                context_settings=EXTRA_ARGS)(train)

plan_app = typer.Typer(
    name="plan", no_args_is_help=True,
    help="Will it fit? Per-GPU memory of a run for every gather/offload choice, before anything starts.")
for _entry in ALGORITHMS.values():
    plan_app.command(_entry.command, help=f"Plan `rlhf {_entry.command}`: the same flags; nothing is started.",
                     context_settings=EXTRA_ARGS,
                     epilog=f"Example: rlhf plan {_entry.command} -r {_entry.name}/pythia-12b-descriptiveness "
                            "--gpu-memory 24GiB --num-gpus 4")(plan)
app.add_typer(plan_app)

serve_app = typer.Typer(
    name="vllm-serve", no_args_is_help=True,
    help=f"Start the vLLM server a `{VLLM_MODE_KEY}: server` run generates with: the run's model, lengths and dtype.")
for _entry in ALGORITHMS.values():
    serve_app.command(_entry.command, help=f"The vLLM server for `rlhf {_entry.command}` with these settings.",
                      epilog=f"Example: {vllm_serve.EXAMPLE}")(vllm_serve.vllm_serve)
app.add_typer(serve_app)


for _command, _example in ((recipes.recipes, recipes.EXAMPLE), (init.init, init.EXAMPLE),
                          (doctor.doctor, doctor.EXAMPLE), (report.report, report.EXAMPLE)):
    app.command(epilog=f"Example: {_example}")(_command)


def main(argv: list[str] | None = None) -> int:
    """`rlhf`: run the command; any error becomes one line per problem and an exit code (cli/errors.py), which
    is imported only then: it prints through the output layer, which a `--help` never needs."""
    for stream in (sys.stdout, sys.stderr):  # a path the terminal's encoding lacks is printed escaped, not fatal
        if callable(getattr(stream, "reconfigure", None)):
            stream.reconfigure(errors="backslashreplace")
    try:
        return typer.main.get_command(app).main(args=argv, prog_name="rlhf", standalone_mode=False) or 0
    except (Exception, KeyboardInterrupt) as error:  # noqa: BLE001 - the one boundary: cli/errors.py decides
        from rlhf_cli.cli.errors import exit_code_for

        return exit_code_for(error)

