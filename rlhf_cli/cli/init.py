"""`rlhf init`: write a commented starter recipe."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from rlhf_cli.algorithms import ALGORITHMS
from rlhf_cli.cli.flags import NO_VALUE
from rlhf_cli.errors import RlhfError
from rlhf_cli.output.files import write_atomic

EXAMPLE = "rlhf init rloo --out my-rloo.yaml && rlhf rloo -r my-rloo.yaml --dry-run"

# The training commands as a choice: `rlhf init ppo`, `rlhf init online-dpo`, ...
Command = Enum("Command", {entry.command: entry.command for entry in ALGORITHMS.values()}, type=str)


def init(
    algorithm: Annotated[Command, typer.Argument(
        metavar="ALGORITHM", help=", ".join(entry.command for entry in ALGORITHMS.values()) + ".",
        show_default=False)],
    out: Annotated[Optional[Path], typer.Option(
        "--out", "-o", metavar="FILE", help="Write the recipe to FILE instead of printing it.")] = None,
    force: Annotated[bool, typer.Option(
        "--force", metavar=NO_VALUE, help="Replace FILE if it exists (a link itself, not its target).")] = False,
) -> None:
    """Print or write a starter recipe with every field you are likely to change, each with a comment."""
    from rlhf_cli.cli.output import stderr
    from rlhf_cli.config.starter import starter_recipe

    if out is None:
        print(starter_recipe(algorithm.value), end="")
        return
    if out.is_dir():
        raise RlhfError(f"{out} is a directory; --out takes a file name like {out / 'recipe.yaml'}")
    if (out.exists() or out.is_symlink()) and not force:
        raise RlhfError(f"{out} already exists; choose another --out or pass --force to overwrite it")
    try:  # a new file renamed over the name: --force replaces a link itself, never the file it points to
        write_atomic(out, starter_recipe(algorithm.value, str(out)))
    except OSError as error:
        raise RlhfError(f"{out}: cannot write the recipe ({error.strerror or error})") from None
    stderr.print(f"Wrote {out}. Check it with: rlhf {algorithm.value} -r {out} --dry-run", highlight=False,
                 markup=False)
