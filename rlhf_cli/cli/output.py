"""Everything the CLI prints: data to stdout, notes and errors to stderr, one error boundary."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from rlhf_cli.config.resolve import ResolvedRun
from rlhf_cli.errors import RlhfError

stdout = Console(soft_wrap=True)
stderr = Console(stderr=True, soft_wrap=True)


@contextmanager
def fail_on_user_errors() -> Iterator[None]:
    """Turn user errors into `Error: ...` lines and an exit code; RLHF_DEBUG=1 shows tracebacks."""
    try:
        yield
    except RlhfError as error:
        if os.environ.get("RLHF_DEBUG"):
            raise
        for line in str(error).splitlines():
            stderr.print(f"[bold red]Error:[/] {line}", highlight=False, markup=True)
        raise typer.Exit(error.exit_code) from None


def print_notes(run: ResolvedRun) -> None:
    for note in run.notes:
        style = "yellow" if note.startswith("warning:") else "dim"
        stderr.print(note, style=style, highlight=False, markup=False)


def _run_dict(run: ResolvedRun) -> dict[str, Any]:
    from rlhf_cli.launch.command import launch_command

    launch = launch_command(run)
    return {
        "algorithm": run.algorithm,
        "recipe": str(run.recipe) if run.recipe else None,
        "trainer": run.group("trainer"),
        "model": run.group("model"),
        "script": run.group("script"),
        "zero3": run.group("zero3"),
        "accelerate": run.accelerate,
        "launch": {"argv": launch.argv, "env": launch.env, "command": launch.shell()},
        "sources": {name: setting.source for name, setting in run.settings.items()},
        "notes": list(run.notes),
    }


def print_run_json(run: ResolvedRun) -> None:
    print(json.dumps(_run_dict(run), indent=2, default=str))


def _settings_table(run: ResolvedRun) -> Table:
    table = Table(title=f"rlhf {run.algorithm.replace('_', '-')}: resolved run", title_justify="left")
    table.add_column("key", style="cyan", no_wrap=True)
    table.add_column("value", overflow="fold")
    table.add_column("from", style="dim")
    for name in sorted(run.settings):
        setting = run.settings[name]
        table.add_row(name, json.dumps(setting.value, default=str), setting.source)
    return table


def _accelerate_table(run: ResolvedRun) -> Table:
    table = Table(title="accelerate / DeepSpeed", title_justify="left")
    table.add_column("key", style="cyan", no_wrap=True)
    table.add_column("value")
    deepspeed = run.accelerate.get("deepspeed_config") or {}
    rows = {key: run.accelerate.get(key) for key in ("distributed_type", "num_processes", "num_machines",
                                                      "mixed_precision", "use_cpu")}
    rows.update({f"deepspeed_config.{key}": value for key, value in deepspeed.items()})
    for key, value in rows.items():
        if value is not None:
            table.add_row(key, str(value))
    return table


def print_run_human(run: ResolvedRun) -> None:
    from rlhf_cli.launch.command import launch_command

    stdout.print(_settings_table(run))
    stdout.print(_accelerate_table(run))
    stdout.print("[bold]launch[/]")
    stdout.print(launch_command(run).shell(), highlight=False, markup=False)
    print_notes(run)
