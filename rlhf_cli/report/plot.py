"""Training curves of one run in one PNG, drawn with matplotlib's Agg canvas (no display needed)."""

from __future__ import annotations

import math
from pathlib import Path

from rlhf_cli.report.metrics import RunMetrics

COLUMNS = 3
PANEL_INCHES = (4.8, 3.4)
TITLE_INCHES = 0.6
DPI = 100
SMOOTH_FROM = 10  # with this many points or more, a moving average is drawn over the faint raw curve
# matplotlib's margins and ticks overflow near float's limit (1.8e308): larger values (and inf, nan) are left out of
# the curves; the table still shows them.
PLOTTABLE = 1e300


def figure_pixels(panels: int) -> tuple[int, int]:
    rows = math.ceil(panels / COLUMNS)
    columns = min(panels, COLUMNS)
    return round(columns * PANEL_INCHES[0] * DPI), round((rows * PANEL_INCHES[1] + TITLE_INCHES) * DPI)


def _moving_average(values: list[float], window: int) -> list[float]:
    """Centred mean over `window` points, shrinking at the ends so the curve spans every step."""
    half = window // 2
    return [sum(part) / len(part) for part in (values[max(0, i - half):i + half + 1] for i in range(len(values)))]


def image_formats() -> list[str]:
    """The file suffixes matplotlib can write (png, pdf, svg, ...), without the dot."""
    from matplotlib.backend_bases import FigureCanvasBase

    return list(FigureCanvasBase.get_supported_filetypes())


def draw(metrics: RunMetrics, out: Path, title: str, image_format: str | None = None) -> None:
    """The curves into `out`, as `image_format` (default: from its suffix)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    width, height = figure_pixels(len(metrics.panels))
    figure = Figure(figsize=(width / DPI, height / DPI), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    rows = math.ceil(len(metrics.panels) / COLUMNS)
    axes = figure.subplots(rows, min(len(metrics.panels), COLUMNS), squeeze=False).flatten()
    for axis in axes[len(metrics.panels):]:
        axis.remove()
    for axis, (panel, names) in zip(axes, metrics.panels, strict=False):
        for index, name in enumerate(names):
            points = [(step, value) for step, value in zip(metrics.steps, metrics.series[name], strict=False)
                      if value is not None and abs(value) < PLOTTABLE]
            steps, values = [p[0] for p in points], [p[1] for p in points]
            colour = f"C{index}"
            if len(values) >= SMOOTH_FROM:
                axis.plot(steps, values, color=colour, alpha=0.3, linewidth=1)
                axis.plot(steps, _moving_average(values, max(3, len(values) // 10)), color=colour, linewidth=2,
                          label=name)
            else:
                axis.plot(steps, values, color=colour, linewidth=2, marker="o", markersize=4, label=name)
        axis.set_title(panel.title, fontsize=11, loc="left")
        axis.set_xlabel("step")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.grid(alpha=0.3)
        axis.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:.4g}"))  # no offset text
        if panel.non_negative:  # from just below 0, so that a curve at 0 stays visible above the axis
            top = axis.get_ylim()[1]
            axis.set_ylim(-0.03 * top, top)
        axis.legend(fontsize=8, frameon=False)
    smoothed = "; faint: as logged, bold: moving average" if len(metrics.steps) >= SMOOTH_FROM else ""
    figure.suptitle(f"{title}\n{len(metrics.steps)} logged steps from {metrics.source.name}{smoothed}", fontsize=11)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=DPI, format=image_format)
