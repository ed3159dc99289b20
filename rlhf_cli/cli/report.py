"""`rlhf report`: a run's training curves as a PNG, and the same numbers as a table."""

from __future__ import annotations

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


def report(
    run_dir: Annotated[Path, typer.Argument(metavar="RUN_DIR", help="A run's output directory.",
                                            show_default=False)],
    out: Annotated[Optional[Path], typer.Option(
        "--out", "-o", metavar="PNG", help="Where to write the plot. Default: RUN_DIR/report.png.")] = None,
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
    new = not png.exists()
    try:
        draw(metrics, png, title)
    except OSError as error:
        raise RlhfError(f"{png}: cannot write the plot ({error.strerror})") from None
    if new and png.parent.resolve() == run_dir.resolve():  # the run's own file now, not one the user wrote
        from rlhf_cli.output.ownership import record_added
        from rlhf_cli.output.run_dir import RunDir

        record_added(RunDir(run_dir), png.name)
    table = _table(metrics, title)
    print_whole(table)
    stderr.print(f"Wrote {png}", highlight=False, markup=False)
