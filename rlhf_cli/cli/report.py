"""`rlhf report`: a run's training curves as a PNG, and the same numbers as a table."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from rlhf_cli.errors import RlhfError

if TYPE_CHECKING:
    from rich.table import Table

    from rlhf_cli.report.metrics import RunMetrics

EXAMPLE = "rlhf report runs/rloo-20250101-120000 --out rloo.png"
TABLE_ROWS = 20


def _table(metrics: RunMetrics, title: str) -> Table:
    from rich.table import Table
    from rich.text import Text

    from rlhf_cli.report.metrics import sample_rows

    names = [name for _, present in metrics.panels for name in present]
    rows = sample_rows(len(metrics.steps), TABLE_ROWS)
    shown = f"{len(rows)} of {len(metrics.steps)} logged steps, first and last included" \
        if len(rows) < len(metrics.steps) else f"{len(rows)} logged steps"
    table = Table(title=Text(title), caption=Text(f"{shown}; from {metrics.source}"), title_justify="left",
                  caption_justify="left")
    table.add_column("step", justify="right", style="cyan")
    for name in names:
        table.add_column(name.replace("/", "/\n"), justify="right")
    for row in rows:
        values = (metrics.series[name][row] for name in names)
        table.add_row(str(metrics.steps[row]), *("-" if value is None else f"{value:.4g}" for value in values))
    return table


def _in_run_dir(png: Path, run_dir: Path) -> bool:
    try:
        return png.parent.resolve() == run_dir.resolve()
    except OSError:
        return False


def _check_target(png: Path, in_run: bool, run_dir: Path, force: bool) -> None:
    """The plot replaces only a file of the run's own (its record lists it), or any file with --force; never a
    directory."""
    if not (png.exists() or png.is_symlink()):
        return
    if png.is_dir() and not png.is_symlink():
        raise RlhfError(f"--out {png} is a directory; give a file name ending in .png")
    if force:
        return
    if in_run and not png.is_symlink():
        from rlhf_cli.output.ownership import holdings

        if png.name in holdings(run_dir).owned:
            return
    what = "a link" if png.is_symlink() else "a file no run record lists as rlhf's"
    raise RlhfError(f"{png} exists and is {what}, which may be yours; pass --force to replace it (a link itself, "
                    "not what it points at), or --out another file")


def report(
    run_dir: Annotated[Path, typer.Argument(metavar="RUN_DIR", help="A run's output directory.",
                                            show_default=False)],
    out: Annotated[Optional[Path], typer.Option(
        "--out", "-o", metavar="PNG", help="Where to write the plot. Default: RUN_DIR/report.png.")] = None,
    force: Annotated[bool, typer.Option(
        "--force", help="Replace a file no run record lists as rlhf's (a link is replaced, not written through).")]
    = False,
) -> None:
    """Plot a run's curves (reward, KL, loss; PPO: value loss, clip fraction) to a PNG and print them as a table."""
    from rlhf_cli.cli.output import print_whole, stderr
    from rlhf_cli.report.metrics import load_metrics
    from rlhf_cli.report.plot import draw, image_formats

    png = out or run_dir / "report.png"
    title = run_dir.resolve().name
    formats = image_formats()
    if png.suffix.lower().lstrip(".") not in formats:
        raise RlhfError(f"--out {png}: matplotlib cannot write a {png.suffix or 'suffix-less'} file; "
                        f"end the name with .png (or .{', .'.join(f for f in formats if f != 'png')})")
    metrics = load_metrics(run_dir)
    in_run = _in_run_dir(png, run_dir)
    _check_target(png, in_run, run_dir, force)
    try:
        # a new file of a name nobody could have laid a link at: the plot never goes through one
        png.parent.mkdir(parents=True, exist_ok=True)
        descriptor, name = tempfile.mkstemp(prefix=f".{png.name}.", suffix=".tmp", dir=png.parent)
        os.close(descriptor)
        temporary = Path(name)
    except OSError as error:
        raise RlhfError(f"{png}: cannot write the plot ({error.strerror})") from None
    try:
        draw(metrics, temporary, title, png.suffix.lower().lstrip("."))
        os.replace(temporary, png)  # replaces a link itself, never what it points at
    except OSError as error:
        temporary.unlink(missing_ok=True)
        raise RlhfError(f"{png}: cannot write the plot ({error.strerror})") from None
    if in_run:  # the run's own file now
        from rlhf_cli.output.ownership import record_added
        from rlhf_cli.output.run_dir import RunDir

        record_added(RunDir(run_dir), png.name)
    table = _table(metrics, title)
    print_whole(table)
    stderr.print(f"Wrote {png}", highlight=False, markup=False)
