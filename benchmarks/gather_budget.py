"""The gather budget on the 100M model: generation time and gathered memory between no-gather and gather, and the
generation batch as the other lever.

Runs `rlhf rloo` on generation.py's 100M-parameter Llama (2 CPU processes, 16 completion tokens, the bounded ZeRO-3
knobs of generation.py's bounded no-gather run: stage3_max_live_parameters 2e7, stage3_prefetch_bucket_size 7e6)
with the generation probe on (RLHF_PROBE_GENERATION=1):

- budgets: `--gather-budget F` for F in 0, 0.25, 0.5, 0.75, 1 (0 resolves to --no-gather, 1 to --gather), each
  `--repeats` times, interleaved (every round runs every budget, in a rotated order). Per run: the mean seconds of
  its generation calls, the most bytes of the policy gathered at once (max over ranks and calls) and the bytes
  the budget gathered once; beside them `rlhf plan`'s `gen weights` for the same flags. Medians over the repeats.
  Target: each budget's time within 1.2x of the straight line between F=0 and F=1, and its gathered peak within
  10% of the plan.
  With `--reuse-runs` it runs nothing and rebuilds the tables from the runs an earlier run left in --work-dir.
- generation batch: without gathering, B in 1, 4, 16, 64 sequences generated together per process (TRL's RLOO
  generates `per_device_train_batch_size` 1 x `steps_per_generation` B per process at once; one step, so one
  generation call a run), `--batch-repeats` times, interleaved: seconds per generated sequence.

    python benchmarks/gather_budget.py [--repeats 5] [--batch-repeats 3] [--steps 2] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from _common import (
    MIB,
    RESULTS,
    WORK,
    build_model,
    markdown_table,
    print_table,
    probe_calls,
    rank_generations,
    write_markdown,
)
from generation import RECIPE, plan_prediction, run_rloo

FRACTIONS = (0.0, 0.25, 0.5, 0.75, 1.0)
BATCHES = (1, 4, 16, 64)
COMPLETION = 16
BOUNDED = ("--set", "stage3_max_live_parameters=20000000", "--set", "stage3_prefetch_bucket_size=7000000")
TARGET_TIME, TARGET_PLAN = 1.2, 0.10


@dataclass(frozen=True)
class Measured:
    """One run: what its ranks' probe recorded."""

    seconds_per_call: float  # mean over the calls, ranks averaged
    seconds_per_sequence: float
    gathered_peak: int  # bytes, max over ranks and calls
    budget_bytes: int  # bytes the budget gathered once (max over calls)
    full_bytes: int  # the policy's bytes
    share: float
    completions: tuple[str, ...]  # the digests of rank 0's generated batches


def budget_flags(fraction: float, steps: int) -> list[str]:
    return ["--gather-budget", f"{fraction:g}", "--max-steps", str(steps), *BOUNDED]


def batch_flags(batch: int) -> list[str]:
    return ["--no-gather", "--max-steps", "1", "--set", "per_device_train_batch_size=1",
            "--set", f"steps_per_generation={batch}", *BOUNDED]


def measure(run_dir: Path, batch: int) -> Measured:
    ranks = rank_generations([run_dir])
    by_rank = probe_calls(run_dir)
    calls = [call for rank_calls in by_rank.values() for call in rank_calls]
    seconds = statistics.mean(call["seconds"] for call in calls)
    return Measured(
        seconds_per_call=seconds, seconds_per_sequence=seconds / batch,
        gathered_peak=max(rank.gathered_peak_bytes for rank in ranks),
        budget_bytes=max(call["budget_bytes"] for call in calls), full_bytes=calls[0]["full_bytes"],
        share=max(rank.gathered_peak_share for rank in ranks),
        completions=tuple(digest for call in by_rank[0] for digest in call["completions"]))


def interleaved(labels: Sequence[str], repeats: int, run: Callable[[str, int], Measured]) -> dict[str, list[Measured]]:
    """Every label once per round, rounds rotated so that no label always runs first or last."""
    results: dict[str, list[Measured]] = {label: [] for label in labels}
    for repeat in range(repeats):
        order = list(labels[repeat % len(labels):]) + list(labels[:repeat % len(labels)])
        for label in order:
            print(f"round {repeat + 1}/{repeats}: {label} ...", flush=True)
            results[label].append(run(label, repeat))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch-repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2, help="training steps per run (one generation call each)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--work-dir", type=Path, default=WORK)
    parser.add_argument("--reuse-runs", action="store_true",
                        help="run nothing: rebuild the tables from the runs an earlier run left in --work-dir")
    args = parser.parse_args()
    model = args.work_dir / "llama-100m"
    parameters = build_model(model)

    def common(flags: list[str]) -> list[str]:
        return ["-r", str(RECIPE), "--model", str(model), "--set", f"max_completion_length={COMPLETION}", *flags]

    budgets = {f"{fraction:g}": fraction for fraction in FRACTIONS}
    plans = {label: plan_prediction(common(budget_flags(fraction, args.steps))) for label, fraction in budgets.items()}

    def launched(flags: list[str], out: Path) -> Path:
        return out if args.reuse_runs else run_rloo(common(flags), out)

    runs = args.work_dir / "runs"
    by_budget = interleaved(list(budgets), args.repeats, lambda label, repeat: measure(
        launched(budget_flags(budgets[label], args.steps), runs / f"budget-{label}-{repeat}"), batch=2))
    batch_labels = [str(batch) for batch in BATCHES]
    by_batch = interleaved(batch_labels, args.batch_repeats, lambda label, repeat: measure(
        launched(batch_flags(int(label)), runs / f"batch-{label}-{repeat}"), batch=int(label)))

    budget_rows, chart = budget_table(by_budget, plans)
    batch_rows = batch_table(by_batch)
    same = {label: len({m.completions for m in runs}) == 1 for label, runs in by_budget.items()}
    identical = len({by_budget[label][0].completions for label in budgets}) == 1
    title = (f"Gather budget: {parameters / 1e6:.0f}M-parameter Llama (fp32), 2 CPU processes, {COMPLETION} "
             f"completion tokens, ZeRO-3 max live 2e7 / prefetch 7e6, {args.steps} generation calls per run")
    print_table(title + f", medians of {args.repeats} interleaved", BUDGET_COLUMNS, budget_rows)
    print_table(f"Generation batch without gathering, medians of {args.batch_repeats} interleaved", BATCH_COLUMNS,
                batch_rows)
    completions = (f"Completions: every run of a budget generated the same tokens as its other repeats: {same}; all "
                   f"five budgets generated the same tokens (rank 0's digests of every generated batch): {identical}.")
    line = partial_line(chart)
    print(completions, line, sep="\n")
    plot(chart, by_batch, args.out / "gather_budget.png", title)
    write_markdown(args.out / "gather_budget.md",
                   f"# {title}\n\nMedians of {args.repeats} interleaved runs per budget.\n\n"
                   f"{markdown_table(BUDGET_COLUMNS, budget_rows)}\n{line}\n\n{completions}\n\n"
                   f"## Generation batch without gathering (medians of {args.batch_repeats} interleaved runs)\n\n"
                   f"{markdown_table(BATCH_COLUMNS, batch_rows)}\n![gather budget](gather_budget.png)\n")


BUDGET_COLUMNS = ["budget", "gen s/call (each run)", "gen s/call", "straight line s", "over the line (per round)",
                  "gathered once MiB (share)", "over the line at that share", "gathered peak MiB (share)", "plan MiB",
                  "plan error %"]
BATCH_COLUMNS = ["sequences per process", "gen s/call", "s per sequence", "s per sequence (each run)",
                 "x faster per sequence than 1"]


def budget_table(by_budget: dict[str, list[Measured]], plans: dict) -> tuple[list[list[str]], dict]:
    """Per budget: times, the straight line between budgets 0 and 1 (of the medians), and the time over the line
    as the median of each round's own ratio (its runs of budgets 0 and 1 draw its line), so that a slow round
    counts against itself only; the same at the share the budget's whole units really gathered."""
    median = {label: statistics.median(m.seconds_per_call for m in runs) for label, runs in by_budget.items()}
    low, high = median["0"], median["1"]
    rows, chart = [], {"fraction": [], "seconds": [], "line": [], "peak": [], "plan": [], "bought": []}

    def over_line(runs: list[Measured], fraction: float) -> float:
        return statistics.median(
            run.seconds_per_call / (zero.seconds_per_call + fraction * (one.seconds_per_call - zero.seconds_per_call))
            for run, zero, one in zip(runs, by_budget["0"], by_budget["1"], strict=True))

    for label, runs in by_budget.items():
        fraction = float(label)
        line = low + fraction * (high - low)
        once = runs[0].full_bytes if fraction == 1 else statistics.median(m.budget_bytes for m in runs)
        bought = once / runs[0].full_bytes  # whole units: up to the budget, not all of it
        peak = statistics.median(m.gathered_peak for m in runs)
        planned = plans[label].weights
        share = statistics.median(m.share for m in runs)
        rows.append([label, ", ".join(f"{m.seconds_per_call:.2f}" for m in runs), f"{median[label]:.2f}",
                     f"{line:.2f}", f"{over_line(runs, fraction):.2f}", f"{once / MIB:.1f} ({bought:.2f})",
                     f"{over_line(runs, bought):.2f}", f"{peak / MIB:.1f} ({share:.2f})", f"{planned / MIB:.1f}",
                     f"{100 * (planned - peak) / peak:+.1f}"])
        for key, value in (("fraction", fraction), ("seconds", median[label]), ("line", line),
                           ("peak", peak / MIB), ("plan", planned / MIB), ("bought", bought)):
            chart[key].append(value)
    return rows, chart


def partial_line(chart: dict) -> str:
    """The budgets below 1 against the share they gathered: a straight line of their own, and where it ends."""
    points = [(bought, seconds) for bought, seconds in zip(chart["bought"], chart["seconds"], strict=True)
              if bought < 1]
    mean_x, mean_y = (statistics.mean(values) for values in zip(*points, strict=True))
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sum((x - mean_x) ** 2 for x, _ in points)
    start = mean_y - slope * mean_x
    worst = max(abs(y - start - slope * x) for x, y in points)
    end, gathered = start + slope, chart["seconds"][-1]
    return (f"Against the share their whole units gathered, the budgets below 1 lie on a straight line of their own, "
            f"{start:.2f} {slope:+.2f} x share s/call (every median within {worst:.3f} s of it); it reaches "
            f"{end:.2f} s at share 1, {end - gathered:.2f} s above gathering everything ({gathered:.2f} s): what "
            f"generating pays per call as long as it fetches anything at all.")


def batch_table(by_batch: dict[str, list[Measured]]) -> list[list[str]]:
    """Per batch: seconds per call and per sequence, and how much faster per sequence than one at a time (the
    median of the ratios within each round, so that a slow round slows both)."""
    single = by_batch["1"]
    rows = []
    for label, runs in by_batch.items():
        faster = statistics.median(one.seconds_per_sequence / run.seconds_per_sequence
                                   for one, run in zip(single, runs, strict=True))
        rows.append([label, f"{statistics.median(m.seconds_per_call for m in runs):.2f}",
                     f"{statistics.median(m.seconds_per_sequence for m in runs):.3f}",
                     ", ".join(f"{m.seconds_per_sequence:.3f}" for m in runs), f"{faster:.1f}"])
    return rows


def plot(chart: dict, by_batch: dict[str, list[Measured]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (time_axis, memory_axis, batch_axis) = plt.subplots(1, 3, figsize=(16, 4.6))
    fractions = chart["fraction"]
    time_axis.plot(fractions, chart["seconds"], "o-", color="#4c72b0", label="measured (median), at the budget")
    time_axis.plot(chart["bought"], chart["seconds"], "x:", color="#dd8452", label="the same, at the share gathered")
    time_axis.plot(fractions, chart["line"], "--", color="#8c8c8c", label="straight line no-gather -> gather")
    time_axis.fill_between(fractions, chart["line"], [TARGET_TIME * v for v in chart["line"]], color="#8c8c8c",
                           alpha=0.15, label=f"target: within {TARGET_TIME}x of the line")
    time_axis.set_xlabel("gather budget (fraction of the policy)")
    time_axis.set_ylabel("generation s per call")
    time_axis.legend(fontsize=8)
    memory_axis.plot(fractions, chart["peak"], "o-", color="#4c72b0", label="gathered peak, measured")
    memory_axis.plot(fractions, chart["plan"], "_", markersize=18, markeredgewidth=3, color="#c44e52",
                     label="rlhf plan: gen weights")
    memory_axis.set_xlabel("gather budget (fraction of the policy)")
    memory_axis.set_ylabel("MiB per rank")
    memory_axis.legend(fontsize=8)
    batches = [int(label) for label in by_batch]
    batch_axis.plot(batches, [statistics.median(m.seconds_per_sequence for m in runs) for runs in by_batch.values()],
                    "o-", color="#4c72b0")
    batch_axis.set_xscale("log", base=2)
    batch_axis.set_yscale("log")
    batch_axis.set_xlabel("sequences generated together per process (no gather)")
    batch_axis.set_ylabel("generation s per sequence")
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


if __name__ == "__main__":
    main()
