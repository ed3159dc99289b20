"""The time plan against the smoke recipes' measured phases, on this machine: does `rlhf plan` (fed by this
machine's calibration, `rlhf doctor --calibrate`) predict each phase's seconds per step, and their ordering?

For each configuration (gather, gather budget 0.5, no-gather, vLLM colocate) it runs `rlhf rloo -r rloo/smoke`
for `--steps` steps, `--repeats` times, interleaved (every round runs every configuration, in a rotated order),
and reads the ranks' measured phases (summary.json: generation, sync, train, saving; seconds per step). Beside
them the plan's for exactly the same flags, its phases summed as the ranks measure them
(rlhf_cli/plan/measured.py). Medians over the repeats, and their spread (min..max); the error of each phase, and
whether the configurations come out in the same order by step time. A table (markdown) and a plot.

The calibration the plan uses is the one remembered in rlhf's cache dir; with `--calibrate` it is measured first.
A rehearsal on this machine leaves corrections the plan applies (the title says so): for the plan's own accuracy,
point RLHF_CACHE at a folder with a calibration and no corrections.json.
Configurations that cannot run here (vLLM not installed) are skipped with the reason.

    python benchmarks/plan_vs_measured.py [--repeats 5] [--steps 4] [--configs gather budget no-gather vllm]
                                           [--calibrate] [--out benchmarks/results]
    python benchmarks/plan_vs_measured.py --repeats 1 --configs gather   (a smoke check of the script itself)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from _common import (
    REPO,
    RESULTS,
    WORK,
    CommandFailed,
    bar_charts,
    json_output,
    markdown_table,
    print_table,
    python_module,
    run_timed,
    write_markdown,
)

sys.path.insert(0, str(REPO))

CONFIGS = {"gather": ["--gather"], "budget": ["--gather-budget", "0.5"], "no-gather": ["--no-gather"],
           "vllm": ["--vllm", "colocate", "--gather"]}
MEASURED = ("generation", "sync", "train")  # the phases every step has (saving is off in the smoke recipe)
TARGET = 0.30  # every phase within 30 % of the measured median


def flags(config: str, steps: int) -> list[str]:
    return ["-r", "rloo/smoke", "--max-steps", str(steps), *CONFIGS[config]]


def planned(config: str, steps: int) -> tuple[dict[str, float], str]:
    """The plan's seconds per step of the run's own configuration, summed as the ranks measure the phases, and
    what it timed (the calibration, its age, and a rehearsal's corrections when one was kept here)."""
    from rlhf_cli.plan.measured import MEASURED_PHASES

    plan = json_output(run_timed(python_module("rlhf_cli", "plan", "rloo", *flags(config, steps), "--json"),
                                 timeout=300).output)
    chosen = next(column for column in plan["configurations"] if column["chosen"])
    if not chosen["time"]:
        raise CommandFailed(f"rlhf plan has no seconds here ({plan['gpu']}): run `rlhf doctor --calibrate` first")
    return ({phase: sum(chosen["time"][name] for name in MEASURED_PHASES[phase]) for phase in MEASURED},
            plan["gpu"]["source"])


def measured(config: str, steps: int, out: Path) -> dict[str, float]:
    """One run's seconds per step by phase (the slowest rank's, as summary.json keeps them)."""
    run_timed(python_module("rlhf_cli", "rloo", *flags(config, steps), "-o", str(out), "--overwrite", "--quiet"),
              timeout=1200)
    phases = json.loads((out / "summary.json").read_text())["phases"]
    return {phase: (phases.get(phase) or {}).get("seconds_per_step") or 0.0 for phase in MEASURED}


def interleaved(configs: list[str], repeats: int, steps: int, work: Path) -> dict[str, list[dict[str, float]]]:
    results: dict[str, list[dict[str, float]]] = {config: [] for config in configs}
    for repeat in range(repeats):
        order = configs[repeat % len(configs):] + configs[:repeat % len(configs)]
        for config in order:
            print(f"round {repeat + 1}/{repeats}: {config} ...", flush=True)
            results[config].append(measured(config, steps, work / "plan-vs-measured" / f"{config}-{repeat}"))
    return results


def table(runs: dict[str, list[dict[str, float]]], plans: dict[str, dict[str, float]]) -> tuple[list[list[str]], bool]:
    """One row per configuration and phase: measured median (spread), planned, error; and whether every phase with
    a measurement is within TARGET."""
    rows, within = [], True
    for config, repeats in runs.items():
        for phase in MEASURED:
            values = [run[phase] for run in repeats]
            median, plan = statistics.median(values), plans[config][phase]
            if median == 0 and plan == 0:
                continue
            error = (plan - median) / median if median else float("inf")
            within &= abs(error) <= TARGET
            rows.append([config, phase, f"{median:.3f}", f"{min(values):.3f}..{max(values):.3f}", f"{plan:.3f}",
                         f"{error:+.0%}" if median else "-"])
    return rows, within


def ordering(runs: dict[str, list[dict[str, float]]],
             plans: dict[str, dict[str, float]]) -> tuple[list[str], list[str]]:
    """The configurations fastest first by measured median step time, and by the plan's."""
    def step(config: str) -> float:
        return statistics.median(sum(run.values()) for run in runs[config])
    return sorted(runs, key=step), sorted(runs, key=lambda config: sum(plans[config].values()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    parser.add_argument("--calibrate", action="store_true", help="measure this machine first (rlhf doctor)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--work-dir", type=Path, default=WORK)
    args = parser.parse_args()
    if args.calibrate:
        run_timed(python_module("rlhf_cli", "doctor", "--calibrate"), timeout=600)
    configs = list(args.configs)
    if "vllm" in configs:
        from rlhf_cli.plan.engines.vllm import installed

        if not installed():
            print("vllm: skipped, vLLM is not installed")
            configs.remove("vllm")
    found = {config: planned(config, args.steps) for config in configs}
    plans = {config: phases for config, (phases, _) in found.items()}
    runs = interleaved(configs, args.repeats, args.steps, args.work_dir)
    rows, within = table(runs, plans)
    by_measured, by_plan = ordering(runs, plans)
    columns = ["configuration", "phase", "measured s/step (median)", "spread", "planned s/step", "error"]
    title = (f"rlhf rloo -r rloo/smoke, {args.steps} steps, {args.repeats} interleaved repeats; plan from "
             f"{found[configs[0]][1]}")
    print_table(title, columns, rows)
    verdict = (f"ordering (fastest first): measured {', '.join(by_measured)}; planned {', '.join(by_plan)} "
               f"({'same' if by_measured == by_plan else 'differs'}); every phase within {TARGET:.0%}: "
               f"{'yes' if within else 'no'}")
    print(verdict)
    write_markdown(args.out / "plan_vs_measured.md",
                   f"## {title}\n\n{markdown_table(columns, rows)}\n{verdict}\n")
    panels = [(f"{phase}: s/step", {f"{config}": statistics.median(run[phase] for run in runs[config])
                                    for config in configs}) for phase in MEASURED]
    bar_charts(args.out / "plan_vs_measured.png", title, panels,
               markers={f"{phase}: s/step": {config: plans[config][phase] for config in configs}
                        for phase in MEASURED}, marker_label="planned")


if __name__ == "__main__":
    main()
