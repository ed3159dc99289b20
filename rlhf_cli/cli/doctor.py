"""`rlhf doctor`: whether this machine is ready to run rlhf, one line per check."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated

import typer

from rlhf_cli.cli.flags import NO_VALUE

EXAMPLE = "rlhf doctor   (on the GPU node, before its first run);  rlhf doctor --calibrate   (measure it for the plan)"
STYLES = {"ok": "green", "warning": "yellow", "problem": "bold red"}


def environment_checks() -> list:
    """The variables every rank inherits (cache directories, counts), judged by the very check a launch makes
    (rlhf_cli/config/file_checks.py): what doctor passes, training does not refuse."""
    import os

    from rlhf_cli.config.file_checks import environ_problems
    from rlhf_cli.machine.readiness import OK, PROBLEM, Check

    problems = environ_problems(os.environ)
    return [Check("environment", PROBLEM, problem) for problem in problems] or \
        [Check("environment", OK, "the cache directories and counts the ranks read from it are usable")]


def doctor(
    json_: Annotated[bool, typer.Option(
        "--json", metavar=NO_VALUE, help="Print the checks as a JSON list, for scripts.")] = False,
    calibrate: Annotated[bool, typer.Option(
        "--calibrate", metavar=NO_VALUE,
        help="Measure this machine's matmul, memory and all-gather rates again (about a minute) and remember them "
             "for the time plan.")] = False,
) -> None:
    """Check python, pinned packages, GPUs, DeepSpeed's build tools and accelerator, the hub; exit 1 on a problem."""
    from rich.table import Table
    from rich.text import Text

    from rlhf_cli.cli.output import print_error, print_json, stdout
    from rlhf_cli.machine import readiness as checks

    if calibrate:
        from rlhf_cli.machine.cache import cache_dir
        from rlhf_cli.machine.calibration import CalibrationFailed
        from rlhf_cli.machine.calibration import calibrate as measure

        try:
            found = measure()
        except CalibrationFailed as error:
            print_error(f"rlhf doctor --calibrate: {error}")
            raise typer.Exit(1) from None
        if not json_:
            stdout.print(f"{found.describe()}; kept in {cache_dir()}", highlight=False, markup=False)

    found = checks.run_checks() + environment_checks()
    problems = [check for check in found if check.status == checks.PROBLEM]
    if json_:
        print_json([asdict(check) for check in found])
    else:
        table = Table.grid(padding=(0, 2))
        for check in found:
            table.add_row(Text(check.status, style=STYLES[check.status]), Text(check.name, style="bold"),
                          Text(check.detail))  # details quote paths and library messages: text, never markup
        stdout.print(table, highlight=False)
        warnings = sum(check.status == checks.WARNING for check in found)
        counts = f"{len(problems)} problem{'s' * (len(problems) != 1)}, {warnings} warning{'s' * (warnings != 1)}"
        stdout.print(counts, style="bold red" if problems else None, highlight=False)
    if problems:
        raise typer.Exit(1)
