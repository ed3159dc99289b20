"""The time plan against the smoke recipes' measured phases, on this machine: does `rlhf plan` (fed by this
machine's calibration, `rlhf doctor --calibrate`) predict each phase's seconds per step, and their ordering? And
does a running job's ETA hold: a 12-step smoke run's ETA on its progress line at step 3 against the time it then
really took?

For each configuration (gather, saving a checkpoint every 2 steps; gather budget 0.5; no-gather; vLLM colocate) it
runs `rlhf rloo -r rloo/smoke` for `--steps` steps, `--repeats` times, interleaved (every round runs every
configuration and one 12-step ETA run, in a rotated order), and reads the ranks' measured phases (summary.json:
generation, sync, train, saving; seconds per step). Beside them the plan's for exactly the same flags, its phases
summed as the ranks measure them (rlhf_cli/plan/measured.py); the plan's saving counted for the checkpoints only
(the final save is no step's). Medians over the repeats, and their spread (min..max); the error of each phase, and
whether the plan orders every pair of configurations as measured, by step time and by the phases they change (a
pair whose runs overlap is a tie, said as one). A table (markdown) and a plot.

The plan uses the calibration in `--cache` (a folder of its own, so no rehearsal's corrections reach the plan),
measured there first when there is none or with `--calibrate`. The machine's load (/proc/loadavg) before and after
goes into the table's file: other work on the machine slows the runs, not the plan.
Configurations that cannot run here (vLLM not installed) are skipped with the reason.

    python benchmarks/plan_vs_measured.py [--repeats 5] [--steps 4] [--configs gather budget no-gather vllm eta]
                                           [--calibrate] [--out benchmarks/results]
    python benchmarks/plan_vs_measured.py --repeats 1 --configs gather eta   (a smoke check of the script itself)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
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

SAVING_EVERY = ["-s", "save_strategy=steps", "-s", "save_steps=2"]
CONFIGS = {"gather": ["--gather", *SAVING_EVERY], "budget": ["--gather-budget", "0.5"], "no-gather": ["--no-gather"],
           "vllm": ["--vllm", "colocate", "--gather"]}
PHASES = {"gather": ("generation", "train", "saving"), "budget": ("generation", "train"),
          "no-gather": ("generation", "train"), "vllm": ("generation", "sync", "train")}
TARGET = 0.30  # every phase within 30 % of the measured median
ETA_STEPS, ETA_AT, ETA_TARGET = 12, 3, 0.20  # a 12-step run's ETA at step 3 within 20 % of what was left
RUN_PROCESSES = 2  # the smoke recipe's ranks
ETA_LINE = re.compile(r"^step (\d+)/(\d+)\s.*\seta (\d+):(\d\d):(\d\d(?:\.\d)?)\s*$")


def flags(config: str, steps: int) -> list[str]:
    return ["-r", "rloo/smoke", "--max-steps", str(steps), *CONFIGS[config]]


def plan_seconds(argv: list[str]) -> tuple[dict[str, float], str]:
    """The chosen configuration's seconds per step by plan phase, and what it timed on."""
    plan = json_output(run_timed(python_module("rlhf_cli", "plan", "rloo", *argv, "--json"), timeout=300).output)
    chosen = next(column for column in plan["configurations"] if column["chosen"])
    if not chosen["time"]:
        raise CommandFailed(f"rlhf plan has no seconds here ({plan['gpu']}): run `rlhf doctor --calibrate` first")
    return chosen["time"], plan["gpu"]["source"]


def planned(config: str, steps: int) -> tuple[dict[str, float], str]:
    """The plan's seconds per step of the run's own configuration, summed as the ranks measure the phases; saving:
    the checkpoints' share (the plan with them less the plan without, which keeps only the final save)."""
    from rlhf_cli.phases import StepPhase

    seconds, source = plan_seconds(flags(config, steps))
    found = {phase: sum(seconds[name] for name in StepPhase(phase).planned) for phase in PHASES[config]}
    if "saving" in found:
        without, _ = plan_seconds(flags(config, steps)[:-len(SAVING_EVERY)])
        found["saving"] -= without["saving"]
    return found, source


def measured(config: str, steps: int, out: Path) -> dict[str, float]:
    """One run's seconds per step by phase (the slowest rank's, as summary.json keeps them)."""
    run_timed(python_module("rlhf_cli", "rloo", *flags(config, steps), "-o", str(out), "--overwrite", "--quiet"),
              timeout=1200)
    phases = json.loads((out / "summary.json").read_text())["phases"]
    return {phase: (phases.get(phase) or {}).get("seconds_per_step") or 0.0 for phase in PHASES[config]}


def eta_run(out: Path) -> dict[str, float]:
    """A 12-step gather run with its progress lines timed as they arrive: the ETA printed at step 3 (the steps
    left and the saves left, the final model's among them), what that then really took (from that line to the last
    step's line, plus the final save as the run measured it, summary.json's `final_save_seconds`), and the seconds
    to the run's exit (the ranks' shutdown and the launcher's summary besides, which no ETA counts)."""
    argv = python_module("rlhf_cli", "rloo", "-r", "rloo/smoke", "--max-steps", str(ETA_STEPS), "--gather",
                         "-o", str(out), "--overwrite")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    seen: dict[int, tuple[float, float]] = {}  # step: (arrival, eta)
    with subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True) as process:
        assert process.stdout is not None
        for line in process.stdout:
            found = ETA_LINE.match(line.strip())
            if found:
                hours, minutes, seconds = int(found[3]), int(found[4]), float(found[5])
                seen[int(found[1])] = (time.monotonic(), hours * 3600 + minutes * 60 + seconds)
        ended = time.monotonic()
    if process.returncode != 0 or ETA_AT not in seen or ETA_STEPS not in seen:
        raise CommandFailed(f"{' '.join(argv)}: exit {process.returncode}, progress lines of steps {sorted(seen)}")
    at, eta = seen[ETA_AT]
    final_save = json.loads((out / "summary.json").read_text()).get("final_save_seconds") or 0.0
    step_at = at - seen[ETA_AT - 1][0]  # step 3's own seconds (its line after step 2's)
    return {"eta": eta, "left": seen[ETA_STEPS][0] - at + final_save, "final_save": final_save,
            "to_exit": ended - at, "later": (seen[ETA_STEPS][0] - at) / (ETA_STEPS - ETA_AT) / step_at}


def interleaved(configs: list[str], repeats: int, steps: int,
                work: Path) -> Iterator[dict[str, list[dict[str, float]]]]:
    """Every round runs every configuration (and "eta": the ETA run), in a rotated order; the results so far after
    each round (a long run stopped early still leaves its table)."""
    results: dict[str, list[dict[str, float]]] = {config: [] for config in configs}
    for repeat in range(repeats):
        order = configs[repeat % len(configs):] + configs[:repeat % len(configs)]
        for config in order:
            print(f"round {repeat + 1}/{repeats}: {config} ...", flush=True)
            out = work / "plan-vs-measured" / f"{config}-{repeat}"
            results[config].append(eta_run(out) if config == "eta" else measured(config, steps, out))
        yield results


def error(plan: float, median: float) -> float:
    return (plan - median) / median if median else float("inf")


def table(runs: dict[str, list[dict[str, float]]], plans: dict[str, dict[str, float]]) -> tuple[list[list[str]], bool]:
    """One row per configuration and phase: measured median (spread), planned, error; and whether every phase with
    a measurement is within TARGET."""
    rows, within = [], True
    for config, repeats in runs.items():
        for phase in PHASES[config]:
            values = [run[phase] for run in repeats]
            median, plan = statistics.median(values), plans[config][phase]
            within &= abs(error(plan, median)) <= TARGET
            rows.append([config, phase, f"{median:.3f}", f"{min(values):.3f}..{max(values):.3f}", f"{plan:.3f}",
                         f"{error(plan, median):+.0%}" if median else "-"])
    return rows, within


def ordering(runs: dict[str, list[dict[str, float]]], plans: dict[str, dict[str, float]],
             phases: tuple[str, ...] = ("generation", "sync", "train")) -> str:
    """How the plan orders the configurations by `phases` summed (by default the step; saving left out: only one
    configuration saves) against the measurement, pair by pair. A pair whose per-run sums overlap (the slower one's
    fastest run beats the faster one's slowest) has no measured order: a tie, which the plan cannot get wrong, and
    is said as one. The verdict names every wrong pair."""
    def sums(config: str) -> list[float]:
        return [sum(run.get(phase, 0.0) for phase in phases) for run in runs[config]]

    def planned(config: str) -> float:
        return sum(plans[config].get(phase, 0.0) for phase in phases)

    measured = sorted(runs, key=lambda config: statistics.median(sums(config)))
    right, wrong, ties = [], [], []
    for position, faster in enumerate(measured):
        for slower in measured[position + 1:]:
            if min(sums(slower)) <= max(sums(faster)):
                ties.append(f"{faster} ~ {slower}")
            else:
                (right if planned(faster) < planned(slower) else wrong).append(f"{faster} < {slower}")
    said = f"{len(right)} of {len(right) + len(wrong)} measured pairs right"
    return (f"measured {', '.join(measured)}; planned {', '.join(sorted(runs, key=planned))}; {said}"
            + (f", wrong: {'; '.join(wrong)}" if wrong else "")
            + (f"; ties (their runs overlap): {'; '.join(ties)}" if ties else ""))


def eta_verdict(runs: list[dict[str, float]]) -> str:
    """Each ETA run's ETA at step 3 against what it counts, as it then really went (the steps to the last one and
    the final save), and how the steps after it went against step 3 itself (a run whose machine slowed or sped up
    after step 3 is off by as much whatever its ETA knew); the median error and whether every run is within
    ETA_TARGET."""
    errors = [error(run["eta"], run["left"]) for run in runs]
    each = ", ".join(f"{run['eta']:.1f} s for {run['left']:.1f} s ({value:+.0%}; later steps {run['later']:.2f}x "
                     f"step {ETA_AT}; final save {run['final_save']:.2f} s; {run['to_exit']:.1f} s to exit)"
                     for run, value in zip(runs, errors, strict=True))
    within = all(abs(value) <= ETA_TARGET for value in errors)
    return (f"ETA at step {ETA_AT} of a {ETA_STEPS}-step gather run (the steps left and the final save), against "
            f"the time to its last step plus its final save as measured (and, beside it, to the run's exit, with "
            f"the ranks' shutdown that no ETA counts): {each}; median error {statistics.median(errors):+.0%}; every "
            f"run within {ETA_TARGET:.0%}: {'yes' if within else 'no'}")


def load_note(loads: tuple[str, str], cores: int) -> str:
    """The load average before and after, and whether other work shared the machine: a run starts 2 processes, so
    a 1-minute load above that (on either reading) means something else ran too."""
    busy = max(float(reading.split()[0]) for reading in loads) > RUN_PROCESSES
    shared = ("above the 2 processes a run starts: other work shared the machine" if busy else
              "at most the 2 processes a run starts: no other work to speak of")
    return f"Load average (1, 5, 15 min) before: {loads[0]}; after: {loads[1]} on {cores} cores ({shared})."


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def prepare_cache(cache: Path, calibrate: bool) -> None:
    """The plan's calibration in a cache of its own; measured when missing or asked."""
    os.environ["RLHF_CACHE"] = str(cache)
    if calibrate or not (cache / "calibration.json").exists():
        run_timed(python_module("rlhf_cli", "doctor", "--calibrate"), timeout=600)


def report(args: argparse.Namespace, configs: list[str], runs: dict, found: dict, loads: tuple[str, str]) -> None:
    plans = {config: phases for config, (phases, _) in found.items()}
    steps_runs = {config: runs[config] for config in configs}
    rows, within = table(steps_runs, plans)
    columns = ["configuration", "phase", "measured s/step (median)", "spread", "planned s/step", "error"]
    done = len(runs[configs[0]])
    title = (f"rlhf rloo -r rloo/smoke, {args.steps} steps, {done} interleaved repeats; plan from "
             f"{found[configs[0]][1]}")
    print_table(title, columns, rows)
    verdict = (f"ordering by step time (fastest first): {ordering(steps_runs, plans)}. By generation and sync (the "
               f"phases the configurations change): {ordering(steps_runs, plans, ('generation', 'sync'))}. Every "
               f"phase within {TARGET:.0%}: {'yes' if within else 'no'}")
    eta = eta_verdict(runs["eta"]) if runs.get("eta") else "ETA: not run"
    machine = load_note(loads, os.cpu_count() or 1)
    print(verdict, eta, machine, sep="\n")
    write_markdown(args.out / "plan_vs_measured.md",
                   f"## {title}\n\n{markdown_table(columns, rows)}\n{verdict}\n\n{eta}\n\n{machine}\n")
    panels = [(f"{phase}: s/step", {config: statistics.median(run[phase] for run in steps_runs[config])
                                    for config in configs if phase in PHASES[config]})
              for phase in ("generation", "sync", "train", "saving")]
    bar_charts(args.out / "plan_vs_measured.png", title, panels,
               markers={label: {config: plans[config][label.split(":")[0]] for config in bars}
                        for label, bars in panels}, marker_label="planned")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--configs", nargs="+", choices=[*CONFIGS, "eta"], default=[*CONFIGS, "eta"])
    parser.add_argument("--calibrate", action="store_true", help="measure this machine first (rlhf doctor)")
    parser.add_argument("--cache", type=Path, default=WORK / "plan-cache")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--work-dir", type=Path, default=WORK)
    args = parser.parse_args()
    before = load()
    prepare_cache(args.cache.resolve(), args.calibrate)
    configs = [config for config in args.configs if config != "eta"]
    if "vllm" in configs:
        from rlhf_cli.generation.choice import Engine
        from rlhf_cli.generation.engines import installed

        if installed(Engine.colocate.spec) is None:
            print("vllm: skipped, vLLM is not installed")
            configs.remove("vllm")
    found = {config: planned(config, args.steps) for config in configs}
    for runs in interleaved(configs + (["eta"] if "eta" in args.configs else []), args.repeats, args.steps,
                            args.work_dir):
        report(args, configs, runs, found, (before, load()))


if __name__ == "__main__":
    main()
