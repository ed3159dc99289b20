"""`rlhf init`: write a commented starter recipe."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from rlhf_cli.cli.output import fail_on_user_errors, stderr
from rlhf_cli.errors import RlhfError

EXAMPLE = "rlhf init rloo --out my-rloo.yaml && rlhf rloo -r my-rloo.yaml --dry-run"


class Algorithm(str, Enum):
    ppo = "ppo"
    rloo = "rloo"
    online_dpo = "online-dpo"


def init(
    algorithm: Annotated[Algorithm, typer.Argument(
        metavar="ALGORITHM", help="ppo, rloo or online-dpo.", show_default=False)],
    out: Annotated[Optional[Path], typer.Option(
        "--out", "-o", metavar="FILE", help="Write the recipe to FILE instead of printing it.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite FILE if it exists.")] = False,
) -> None:
    """Print or write a starter recipe with every field you are likely to change, each with a comment."""
    from rlhf_cli.config.starter import starter_recipe

    name = algorithm.value.replace("-", "_")
    if out is None:
        print(starter_recipe(name), end="")
        return
    with fail_on_user_errors():
        if out.is_dir():
            raise RlhfError(f"{out} is a directory; --out takes a file name like {out / 'recipe.yaml'}")
        if out.exists() and not force:
            raise RlhfError(f"{out} already exists; choose another --out or pass --force to overwrite it")
        try:
            out.write_text(starter_recipe(name, str(out)))
        except OSError as error:
            raise RlhfError(f"{out}: cannot write the recipe ({error.strerror})") from None
    stderr.print(f"Wrote {out}. Check it with: rlhf {algorithm.value} -r {out} --dry-run", highlight=False,
                 markup=False)
