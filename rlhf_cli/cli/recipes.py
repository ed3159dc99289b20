"""`rlhf recipes`: the bundled recipes, one entry each."""

from __future__ import annotations

from typing import Annotated

import typer

from rlhf_cli.cli.flags import NO_VALUE

EXAMPLE = "rlhf recipes, then: rlhf rloo -r rloo/smoke --dry-run"


def recipes(
    json_: Annotated[bool, typer.Option(
        "--json", metavar=NO_VALUE, help="Print them as a JSON list, for scripts.")] = False,
) -> None:
    """List the bundled recipes: the name to pass to -r, the algorithm, the model and what each is for."""
    from rich.text import Text

    from rlhf_cli.cli.output import print_json, stdout
    from rlhf_cli.config.bundled import bundled_recipes

    found = bundled_recipes()
    if json_:
        print_json([{"name": r.name, "algorithm": r.algorithm, "model": r.model, "purpose": r.purpose,
                    "path": str(r.path)} for r in found])
        return
    # Columns are padded by hand so that each purpose can take a line of its own and fit any terminal width.
    columns = [("NAME (for -r)", [r.name for r in found]), ("ALGORITHM", [r.algorithm for r in found]),
               ("MODEL", [r.model for r in found])]
    widths = [max(len(title), *map(len, cells)) for title, cells in columns]
    header = "  ".join(title.ljust(width) for (title, _), width in zip(columns, widths, strict=True))
    stdout.print(Text(header.rstrip(), style="bold"))
    for recipe in found:
        stdout.print(Text.assemble((recipe.name.ljust(widths[0]), "cyan"), "  ",
                                   recipe.algorithm.ljust(widths[1]), "  ", recipe.model))
        stdout.print(Text(f"    {recipe.purpose}", style="dim"))
