"""LoRA: what `rlhf plan` says fits with and without it, and per-rank memory measured on the CPU beside the plan.

Plan (no torch, a second): PPO and RLOO on the seed (pythia-12b, pythia-70m reward, 4 x 23.7 GiB), Llama-3-70B
(Llama-3.1-8B reward and value) on 8 x 80 GiB and on 8 x 24 GiB, and Qwen2.5-32B (Qwen2.5-7B reward and value)
on 4 x 24 GiB, with the seed recipe's trainer fields; config.json of each from tests/fixtures/models. For each,
how many of the plan's configurations fit per GPU without LoRA (of 6) and with it (of 4), and the one that needs
the least host memory: its GPU peak and the CPU memory per machine it offloads to.

Measured (`--measure`, 2 CPU processes under ZeRO-3, fp32, about 15 minutes): the generation benchmark's
100M-parameter Llama as policy, trained with PPO (a reward function; the value model starts from the policy: 100M
too) and with RLOO (beta 0.05: a reference model without LoRA), with and without `--lora`. Each rank's peak
anonymous resident memory (RssAnon, sampled every 20 ms: tensors and the allocator's heap, not mapped files or
libraries) less that of the same run on the 0.1M-parameter smoke policy, which takes out what does not grow with
the model (Python, torch, DeepSpeed's fixed buffers, the data); beside the same difference of `rlhf plan`'s peak
for the run's own flags (its fixed CUDA allowance cancels too), and the error. Each run twice: with glibc's mmap
threshold fixed at 64 KiB (MALLOC_MMAP_THRESHOLD_), so that every tensor above it is a mapping of its own,
returned when freed, and RssAnon follows the live tensors the plan counts (as CUDA's max_memory_allocated
would); and with glibc's defaults, whose heap keeps what was freed (as CUDA's caching allocator reserves more
than it allocates). Runs go under the launch lock (/tmp/rlhf-launch.lock), one at a time.

    python benchmarks/lora.py [--measure] [--steps 3] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from _common import (
    MIB,
    RECIPES,
    REPO,
    RESULTS,
    WORK,
    CommandFailed,
    build_model,
    cache_model_configs,
    json_output,
    markdown_table,
    print_table,
    python_module,
    run_timed,
    write_markdown,
)

from rlhf_cli.config.resolve import RunRequest, resolve
from rlhf_cli.plan.columns import Column, Plan
from rlhf_cli.plan.estimate import plan_run
from rlhf_cli.plan.memory import GIB

HUB_MODELS = {"EleutherAI/pythia-12b": "pythia-12b", "EleutherAI/pythia-70m": "pythia-70m",
              "meta-llama/Meta-Llama-3-70B": "llama-3-70b", "meta-llama/Llama-3.1-8B": "llama-3.1-8b",
              "Qwen/Qwen2.5-32B": "qwen2.5-32b", "Qwen/Qwen2.5-7B": "qwen2.5-7b"}
LOCK = "/tmp/rlhf-launch.lock"
SMOKE_POLICY = RECIPES / "smoke" / "policy"
LEARNABLE_REWARD = f"{REPO}/tests/fixtures/rewards.py:letter_e"


@dataclass(frozen=True)
class Setup:
    name: str
    policy: str
    reward: str
    gpus: int
    gpu_memory: str


SETUPS = [
    Setup("seed: pythia-12b, pythia-70m reward", "EleutherAI/pythia-12b", "EleutherAI/pythia-70m", 4, "23.7GiB"),
    Setup("Llama-3-70B, Llama-3.1-8B reward", "meta-llama/Meta-Llama-3-70B", "meta-llama/Llama-3.1-8B", 8, "80GiB"),
    Setup("Llama-3-70B, Llama-3.1-8B reward", "meta-llama/Meta-Llama-3-70B", "meta-llama/Llama-3.1-8B", 8, "24GiB"),
    Setup("Qwen2.5-32B, Qwen2.5-7B reward", "Qwen/Qwen2.5-32B", "Qwen/Qwen2.5-7B", 4, "24GiB"),
]


def plan_setup(setup: Setup, algorithm: str) -> Plan:
    recipe = RECIPES / algorithm / "pythia-12b-descriptiveness.yaml"
    flags = {"model_name_or_path": ("--model", setup.policy), "reward_model_name_or_path": ("--reward-model",
                                                                                             setup.reward),
             "gpu_memory": ("--gpu-memory", setup.gpu_memory), "num_gpus": ("--num-gpus", setup.gpus)}
    plan = plan_run(resolve(RunRequest(algorithm, str(recipe), flags), cuda=True))
    if not plan.known:
        raise CommandFailed(f"{setup.name}: no plan: {plan.why_unknown}")
    return plan


def least_host_memory(columns: list[Column]) -> str:
    """The fitting configuration that offloads least (gathering when it can): label, GPU peak, CPU per machine."""
    fitting = [column for column in columns if column.fits]
    if not fitting:
        return "none"
    best = min(fitting, key=lambda column: (column.cpu_per_machine, not column.candidate.gather))
    label = best.candidate.label.removeprefix("LoRA, ")
    return f"{label}: {best.peak / GIB:.1f} GiB, CPU {best.cpu_per_machine / GIB:.0f} GiB"


PLAN_COLUMNS = ["models", "GPUs", "algorithm", "fit without LoRA", "least host memory without LoRA",
                "fit with LoRA", "least host memory with LoRA"]


def plan_rows() -> list[list[str]]:
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        os.environ["HF_HUB_CACHE"] = str(Path(scratch) / "hub")
        cache_model_configs(Path(scratch) / "hub", HUB_MODELS)
        for setup in SETUPS:
            for algorithm in ("ppo", "rloo"):
                plan = plan_setup(setup, algorithm)
                full = [c for c in plan.columns if not c.candidate.lora and c.candidate.engine_settings is None][:6]
                lora = [c for c in plan.columns if c.candidate.lora][:4]
                rows.append([setup.name, f"{setup.gpus} x {setup.gpu_memory}", algorithm,
                             f"{sum(c.fits for c in full)} of {len(full)}", least_host_memory(full),
                             f"{sum(c.fits for c in lora)} of {len(lora)}", least_host_memory(lora)])
    return rows


# -- measured on the CPU ------------------------------------------------------------------------------------------

# glibc: every allocation above 64 KiB gets a mapping of its own, unmapped when freed
LIVE_TENSORS = {"MALLOC_MMAP_THRESHOLD_": "65536"}


@dataclass(frozen=True)
class Measured:
    algorithm: str
    lora: bool
    rank_peaks: list[int]  # bytes above the smoke run's, per rank, with glibc's mmap threshold fixed
    cached_peak: int  # the same with glibc's defaults, the larger rank
    planned: int  # bytes above the smoke run's plan


def run_flags(algorithm: str, model: Path, lora: bool, steps: int) -> list[str]:
    common = ["--model", str(model), "--gather", "--lora" if lora else "--no-lora"]
    if algorithm == "ppo":  # the value model starts from the policy: no reward model, a reward function
        return ["-r", str(RECIPES / "ppo" / "smoke.yaml"), *common, "--set", "reward_model_name_or_path=null",
                "--set", f"reward_funcs=[{LEARNABLE_REWARD}]", "--set", f"total_episodes={8 * steps}"]
    return ["-r", str(RECIPES / "rloo" / "smoke.yaml"), *common, "--max-steps", str(steps), "--set", "beta=0.05"]


def anonymous_memory(pid: int) -> int:
    """RssAnon of a process in bytes; 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return 0
    return 0


def rank_processes(launcher: int) -> dict[int, int]:
    """pid -> RANK of each rank process below `launcher` (torch's launcher sets RANK)."""
    import psutil

    ranks = {}
    try:
        children = psutil.Process(launcher).children(recursive=True)
    except psutil.NoSuchProcess:
        return ranks
    for child in children:
        try:
            if any("rlhf_cli.rank" in part for part in child.cmdline()) and "RANK" in child.environ():
                ranks[child.pid] = int(child.environ()["RANK"])
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return ranks


def peak_per_rank(argv: list[str], out: Path, env: dict[str, str]) -> list[int]:
    """Run `rlhf ...` (under the launch lock) and sample each rank's RssAnon; the peak per rank, in bytes."""
    env = {**os.environ, "PYTHONPATH": str(REPO), **env}
    launched = subprocess.Popen(["flock", LOCK, *argv, "-o", str(out), "--overwrite", "--quiet"], cwd=REPO, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peaks: dict[int, int] = {}
    done = threading.Event()

    def sample() -> None:
        ranks: dict[int, int] = {}
        while not done.wait(0.02):
            if len(ranks) < 2:  # looked for until both ranks have started; reading their status is cheap
                ranks.update(rank_processes(launched.pid))
            for pid, rank in ranks.items():
                peaks[rank] = max(peaks.get(rank, 0), anonymous_memory(pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    output, _ = launched.communicate()
    done.set()
    sampler.join()
    if launched.returncode != 0 or len(peaks) != 2:
        raise CommandFailed(f"{' '.join(argv)} exited {launched.returncode}, ranks seen {sorted(peaks)}:\n"
                            f"{output[-4000:]}")
    return [peaks[rank] for rank in sorted(peaks)]


def planned_peak(flags: list[str]) -> int:
    """`rlhf plan` of exactly these flags: the run's own configuration's peak per GPU (here: per rank)."""
    plan = json_output(run_timed(python_module("rlhf_cli", "plan", *flags, "--json"), timeout=120).output)
    if not plan["known"]:
        raise CommandFailed(f"rlhf plan could not plan {flags}: {plan['why_unknown']}")
    return next(column["peak_gpu"] for column in plan["configurations"] if column["chosen"])


def measure(algorithm: str, lora: bool, model: Path, steps: int, work: Path) -> Measured:
    print(f"measuring {algorithm} {'with' if lora else 'without'} LoRA ...", flush=True)
    peaks, plans = {}, {}
    for name, policy in (("model", model), ("smoke", SMOKE_POLICY)):
        flags = run_flags(algorithm, policy, lora, steps)
        plans[name] = planned_peak([algorithm, *flags])
        for allocator, env in (("live", LIVE_TENSORS), ("cached", {})):
            peaks[name, allocator] = peak_per_rank(
                [sys.executable, "-m", "rlhf_cli", algorithm, *flags],
                work / "runs" / f"{algorithm}-{'lora' if lora else 'full'}-{name}-{allocator}", env)
    above = {allocator: [peak - smoke for peak, smoke in zip(peaks["model", allocator], peaks["smoke", allocator],
                                                              strict=True)] for allocator in ("live", "cached")}
    return Measured(algorithm, lora, above["live"], max(above["cached"]), plans["model"] - plans["smoke"])


MEASURED_COLUMNS = ["algorithm", "LoRA", "measured MiB rank 0", "measured MiB rank 1", "plan MiB", "plan error",
                    "glibc defaults MiB (cached)"]


def measured_rows(results: list[Measured]) -> list[list[str]]:
    rows = []
    for result in results:
        measured = max(result.rank_peaks)
        rows.append([result.algorithm, "yes" if result.lora else "no",
                     *(f"{peak / MIB:.0f}" for peak in result.rank_peaks), f"{result.planned / MIB:.0f}",
                     f"{100 * (result.planned - measured) / measured:+.1f}%", f"{result.cached_peak / MIB:.0f}"])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--measure", action="store_true", help="also run the CPU measurements (about 15 minutes)")
    parser.add_argument("--steps", type=int, default=3, help="training steps per measured run")
    parser.add_argument("--algorithms", nargs="+", default=["ppo", "rloo"])
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--work-dir", type=Path, default=WORK, help="where the model and the runs go (not in git)")
    args = parser.parse_args()

    rows = plan_rows()
    title = "rlhf plan with and without LoRA: configurations that fit per GPU (90% of its memory)"
    print_table(title, PLAN_COLUMNS, rows)
    text = f"# {title}\n\n{markdown_table(PLAN_COLUMNS, rows)}\n"
    if args.measure:
        model = args.work_dir / "llama-100m"
        parameters = build_model(model)
        results = [measure(algorithm, lora, model, args.steps, args.work_dir)
                   for algorithm in args.algorithms for lora in (False, True)]
        measured_title = (f"Per-rank peak memory above the smoke run, 2 CPU processes under ZeRO-3, "
                          f"{parameters / 1e6:.0f}M-parameter Llama (fp32), gathering, {args.steps} steps")
        print_table(measured_title, MEASURED_COLUMNS, measured_rows(results))
        text += f"\n# {measured_title}\n\n{markdown_table(MEASURED_COLUMNS, measured_rows(results))}\n"
    method = "\n\n".join(__doc__.split("\n\n")[:-1])
    write_markdown(args.out / "lora.md", f"{text}\n## Method\n\n{method}\n")


if __name__ == "__main__":
    main()
