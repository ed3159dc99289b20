"""Launcher overhead: `rlhf rloo` against TRL's own RLOO script on the same smoke run, and start-up times.

The TRL run gets exactly what `rlhf rloo --dry-run --json` resolves: the same trainer arguments, model,
reward model and prompts (TRL reads a local dataset as a directory, so the prompts file is copied into
one), the same accelerate config (2 processes, ZeRO-3, CPU) and the same environment (DS_ACCELERATOR=cpu),
started with `accelerate launch` (see `trl_run` for why not `trl rloo`).
Both run with --gather: stock TRL crashes without it. The two are timed end to end (start to exit),
interleaved, `--repeats` times each, in one run of this script; the ratio of the medians is reported. `rlhf`
runs twice a repeat: first with an empty cache of passed pre-launch checks (the check runs, as on a run's first
start), then again with that cache (the check is remembered, as on every later start of the same run).

Start-up: the median of 5 runs of `rlhf --help`, `rlhf rloo -r rloo/smoke --dry-run`, `trl --help` and
`accelerate --help`; and the pre-launch check's own seconds (the trainer config built and the reward functions
imported in a process of their own, rlhf_cli/launch/prelaunch.py), which a launch spends while the launch supervisor
imports torch and accelerate.

    python benchmarks/launcher.py [--steps 4] [--repeats 5] [--out benchmarks/results] [--startup-only]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml
from _common import (
    RECIPES,
    REPO,
    RESULTS,
    WORK,
    bar_charts,
    json_output,
    markdown_table,
    median_seconds,
    print_table,
    python_module,
    run_timed,
    write_markdown,
)

RECIPE = RECIPES / "rloo" / "smoke.yaml"
CACHE_ENV = "RLHF_CACHE"  # rlhf_cli/launch/prelaunch.py: where passed pre-launch checks are remembered
STARTUP_REPEATS = 5
COLD, WARM, TRL = "rlhf rloo, check cold", "rlhf rloo, check remembered", "TRL rloo.py"


def console_script(name: str) -> str:
    """The installed entry point `name` of this interpreter's environment."""
    path = Path(sys.executable).with_name(name)
    return str(path) if path.exists() else shutil.which(name) or name


def rlhf_argv(out: Path, steps: int, *extra: str) -> list[str]:
    return python_module("rlhf_cli", "rloo", "-r", str(RECIPE), "-o", str(out), "--max-steps", str(steps),
                         "--gather", *extra)


def trl_run(work: Path, steps: int) -> tuple[list[str], dict[str, str]]:
    """argv and environment of TRL's RLOO script for the run rlhf resolves; writes its config files into `work`.

    It is what `trl rloo --config` launches, started with `accelerate launch`: `trl rloo`
    itself builds the trainer config in the launcher process, where `ddp_backend: gloo` (which the CPU ranks
    need, or they count one process and DeepSpeed refuses the batch size) asks for a process group that
    does not exist there.
    """
    # TRL's script writes its model into trl-run, which rlhf (rightly) takes for the user's files: a rerun in the
    # same checkout starts from an empty directory
    shutil.rmtree(work / "trl-run", ignore_errors=True)
    resolved = json_output(run_timed(rlhf_argv(work / "trl-run", steps, "--dry-run", "--json")).output)
    data = work / "prompts"
    data.mkdir(parents=True, exist_ok=True)
    shutil.copy(resolved["script"]["dataset_name"], data / "train.jsonl")
    config = {**resolved["trainer"], **resolved["model"], **resolved["script"], "dataset_name": str(data)}
    (work / "trl_rloo.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    (work / "accelerate.yaml").write_text(yaml.safe_dump(resolved["accelerate"], sort_keys=False))
    from importlib import resources

    script = resources.files("trl.scripts").joinpath("rloo.py")
    argv = [console_script("accelerate"), "launch", "--config_file", str(work / "accelerate.yaml"), str(script),
            "--config", str(work / "trl_rloo.yaml")]
    return argv, resolved["launch"]["env"]


PRELAUNCH_TIMED = """
import sys, time
from pathlib import Path
from rlhf_cli.config.resolve import RunRequest, resolve
from rlhf_cli.launch.prelaunch import check_before_launch

run = resolve(RunRequest("rloo", sys.argv[1], {"output_dir": ("-o", sys.argv[2])}, overwrite=True))
started = time.perf_counter()
check_before_launch(run)
print(time.perf_counter() - started)
"""


def startup_seconds(work: Path) -> dict[str, float]:
    commands = {
        "rlhf --help": python_module("rlhf_cli", "--help"),
        "rlhf rloo -r rloo/smoke --dry-run": python_module("rlhf_cli", "rloo", "-r", "rloo/smoke", "--dry-run"),
        "trl --help": [console_script("trl"), "--help"],
        "accelerate --help": [console_script("accelerate"), "--help"],
    }
    seconds = {name: median_seconds(argv, STARTUP_REPEATS) for name, argv in commands.items()}
    seconds["pre-launch check (beside the supervisor's start)"] = prelaunch_seconds(work, STARTUP_REPEATS)
    return seconds


def prelaunch_seconds(work: Path, repeats: int) -> float:
    """Median seconds of `rlhf rloo -r rloo/smoke`'s pre-launch check, alone: each with an empty cache, so that
    the check runs rather than being remembered from the last one."""
    argv = [sys.executable, "-c", PRELAUNCH_TIMED, str(RECIPE), str(work / "prelaunch-run")]
    seconds = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as cache:
            done = subprocess.run(argv, check=True, capture_output=True, text=True, cwd=REPO,
                                  env={**os.environ, CACHE_ENV: cache})
        seconds.append(float(done.stdout.split()[-1]))
    return statistics.median(seconds)


def timed_runs(work: Path, steps: int, repeats: int, trl_argv: list[str],
               trl_env: dict[str, str]) -> dict[str, list[float]]:
    """Wall seconds of each launcher, interleaved: per repeat `rlhf rloo` with an empty cache of passed checks
    (the check runs), the same run again with that cache (the check is remembered), then TRL's script."""
    seconds: dict[str, list[float]] = {COLD: [], WARM: [], TRL: []}
    for repeat in range(repeats):
        print(f"repeat {repeat + 1}/{repeats}: {', '.join(seconds)} ...", flush=True)
        with tempfile.TemporaryDirectory() as cache:
            for name in (COLD, WARM):
                shutil.rmtree(work / "rlhf-run", ignore_errors=True)  # each starts from an empty output dir
                seconds[name].append(run_timed(rlhf_argv(work / "rlhf-run", steps), env={CACHE_ENV: cache}).seconds)
        shutil.rmtree(work / "trl-run", ignore_errors=True)
        seconds[TRL].append(run_timed(trl_argv, env=trl_env).seconds)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4, help="training steps per run (the smoke recipe's 4)")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each launcher, interleaved")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--work-dir", type=Path, default=WORK, help="where the runs go (not in git)")
    parser.add_argument("--startup-only", action="store_true",
                        help="only the start-up table: no runs, nothing written to --out")
    args = parser.parse_args()
    work = args.work_dir / "launcher"
    startup = startup_seconds(work)
    startup_columns = ["command", f"median s of {STARTUP_REPEATS}"]
    startup_rows = [[name, f"{value:.2f}"] for name, value in startup.items()]
    if args.startup_only:
        print_table("Start-up", startup_columns, startup_rows)
        return

    trl_argv, trl_env = trl_run(work, args.steps)
    seconds = timed_runs(work, args.steps, args.repeats, trl_argv, trl_env)
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    ratios = {name: medians[name] / medians[TRL] for name in (COLD, WARM)}

    title = (f"Launcher overhead: RLOO smoke run, {args.steps} steps, 2 CPU processes, ZeRO-3, gather; "
             f"{args.repeats} interleaved runs each")
    run_columns = ["launcher", "wall s (each run)", "median s", "ratio rlhf/trl"]
    run_rows = [[name, ", ".join(f"{value:.1f}" for value in values), f"{medians[name]:.1f}",
                 f"{ratios[name]:.3f}" if name in ratios else ""] for name, values in seconds.items()]
    print_table(title, run_columns, run_rows)
    print_table("Start-up", startup_columns, startup_rows)
    bar_charts(args.out / "launcher.png", title, [("wall seconds, median", medians), ("start-up seconds", startup)])
    write_markdown(args.out / "launcher.md", f"# {title}\n\n{markdown_table(run_columns, run_rows)}\n"
                   f"## Start-up (median of {STARTUP_REPEATS})\n\n{markdown_table(startup_columns, startup_rows)}\n"
                   f"![launcher](launcher.png)\n")


if __name__ == "__main__":
    main()
