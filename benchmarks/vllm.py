"""HF generation under ZeRO-3 against vLLM (colocated with a dense or a delta weight sync, and a server): equal work,
interleaved repeats, at an RL learning rate and a large one.

`rlhf ppo` on the smoke recipe (2 CPU processes under ZeRO-3), bf16 policy and generator (a bf16 generator is what
lets the delta sync go sparse), the same batch and the same number of sampled tokens in every run (no stop token:
every response is `--completion-length` tokens). Each step's work in every mode is generation plus what the mode
needs before generating:

- HF `generate` with `--gather`, `--gather-budget B` and `--no-gather`: seconds per call from the generation probe
  (RLHF_PROBE_GENERATION=1), its gathering included;
- vLLM colocate, `--gather`, with the dense sync (`weight_sync_delta=false`: every sync sends the whole policy) and
  with the delta sync: vLLM's generation seconds plus the weight sync's;
- vLLM server (`rlhf vllm-serve`, started once here, + `--vllm server`): the same, the sync through the run's
  directory.

What a run records is read back, not re-measured: per sync the bytes sent, dense or sparse, seconds and peak memory
(`vllm_sync` in ranks/rank-N.json). Modes run interleaved (every mode at both learning rates, then again) for
`--repeats` rounds; a value is the median over every step after the first (the first sync is dense in every mode
and the first call builds caches) of every repeat, its spread the min-max of the same. Needs vLLM:

    /path/to/venv-with-vllm/bin/python benchmarks/vllm.py [--repeats 5] [--steps 3] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from _common import (
    MIB,
    RECIPES,
    VLLM_ENV,
    bar_charts,
    benchmark_parser,
    markdown_table,
    print_table,
    python_module,
    run_timed,
    socket_port,
    vllm_server,
    write_markdown,
)

RECIPE = RECIPES / "ppo" / "smoke.yaml"
SERVER = "vLLM server, delta"
RATES = ["1e-6", "1e-3"]  # an RL learning rate and a large one


@dataclass(frozen=True)
class Mode:
    name: str
    flags: tuple[str, ...]


def modes(budget: str) -> list[Mode]:
    return [Mode("HF gather", ("--gather",)), Mode(f"HF budget {budget}", ("--gather-budget", budget)),
            Mode("HF no-gather", ("--no-gather",)),
            Mode("vLLM colocate, dense sync", ("--vllm", "colocate", "--gather", "--set", "weight_sync_delta=false")),
            Mode("vLLM colocate, delta sync", ("--vllm", "colocate", "--gather")),
            Mode(SERVER, ("--vllm", "server", "--gather"))]


def run_flags(mode: Mode, rate: str, steps: int, completion_length: int, rollouts: int) -> list[str]:
    batch = ("--set", "per_device_train_batch_size=2", "--set", f"gradient_accumulation_steps={rollouts // 2}",
             "--set", f"local_rollout_forward_batch_size={rollouts}", "--set", "num_ppo_epochs=1")
    return ["-r", str(RECIPE), "--max-steps", str(steps), "--set", "bf16=true", "--set", f"learning_rate={rate}",
            "--set", f"response_length={completion_length}", "--set", "stop_token=null",
            "--set", "missing_eos_penalty=null", *batch, *mode.flags]


@dataclass
class Pooled:
    """One mode at one learning rate: the per-step values of every repeat, pooled."""

    step_seconds: list[float] = field(default_factory=list)  # generation + its sync, mean over ranks
    generation_seconds: list[float] = field(default_factory=list)
    sync_seconds: list[float] = field(default_factory=list)
    bytes_sent: list[int] = field(default_factory=list)  # all ranks' together, per sync
    sparse: list[bool] = field(default_factory=list)
    peak_memory: list[int] = field(default_factory=list)  # per run, max over ranks: the sync's, else the call's
    dense_bytes: int | None = None
    runs: int = 0


def _rank_records(run: Path) -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted((run / "ranks").glob("rank-*.json"))
            if re.fullmatch(r"rank-\d+\.json", path.name)]


def read_run(run: Path, into: Pooled) -> None:
    """Add one finished run's steps after the first to `into`."""
    records = _rank_records(run)
    into.runs += 1
    if not records[0].get("vllm_sync"):
        calls = [[call["seconds"] for call in r["generation_probe"]["per_call"]][1:] for r in records]
        into.step_seconds += [statistics.mean(step) for step in zip(*calls, strict=True)]
        into.generation_seconds = into.step_seconds
        into.peak_memory.append(max(call["rss_peak_bytes"] for r in records
                                    for call in r["generation_probe"]["per_call"]))
        return
    generation = [r["vllm_generation_seconds"][1:] for r in records]
    # the sync before each generation call (a server's run also syncs before its first; the last may follow none)
    syncs = [r["vllm_sync"][-len(r["vllm_generation_seconds"]) - 1:][:len(r["vllm_generation_seconds"])][1:]
             for r in records]
    for calls in zip(*generation, *syncs, strict=True):
        seconds, synced = calls[:len(records)], calls[len(records):]
        into.generation_seconds.append(statistics.mean(seconds))
        into.sync_seconds.append(statistics.mean(sync["seconds"] for sync in synced))
        into.step_seconds.append(into.generation_seconds[-1] + into.sync_seconds[-1])
        into.bytes_sent.append(synced[0]["bytes_sent"])
        into.sparse.append(synced[0]["mode"] == "sparse")
    into.peak_memory.append(max(sync["peak_memory_bytes"] for r in records for sync in r["vllm_sync"]))
    into.dense_bytes = records[0]["vllm_sync"][0]["dense_bytes"]


def spread(values: list[float], scale: float = 1.0, digits: int = 2) -> str:
    if not values:
        return ""
    low, mid, high = min(values) / scale, statistics.median(values) / scale, max(values) / scale
    return f"{mid:.{digits}f} ({low:.{digits}f}-{high:.{digits}f})"


def row(name: str, rate: str, pooled: Pooled, reference: float | None) -> list[str]:
    step = statistics.median(pooled.step_seconds)
    vs = f"{reference / step:.2f}" if reference else ""
    sync = ""
    if pooled.bytes_sent:
        share = statistics.median(pooled.bytes_sent) / pooled.dense_bytes
        sparse = sum(pooled.sparse)
        sync = f"{spread(pooled.bytes_sent, 1024, 1)} ({share:.3f} of dense; {sparse}/{len(pooled.sparse)} sparse)"
    return [name, rate, str(pooled.runs), spread(pooled.step_seconds), vs, spread(pooled.generation_seconds),
            spread(pooled.sync_seconds, digits=3), sync, spread(pooled.peak_memory, MIB, 0)]


COLUMNS = ["mode", "lr", "runs", "s/step: gen + sync", "speed vs HF gather", "gen s", "sync s", "KiB sent per sync",
           "peak RSS MiB"]
BUSY_LOAD = 3.0  # a run's 2 ranks (and, in server mode, the idle server): a 1-minute load above this is other work


def load() -> str:
    """The load average (1, 5, 15 minutes): how shared the machine was."""
    return " / ".join(f"{value:.1f}" for value in os.getloadavg())


def slug(mode: Mode, rate: str) -> str:
    return f"{re.sub('[^a-z0-9]+', '-', mode.name.lower()).strip('-')}-lr{rate}"


def all_rates(args: argparse.Namespace) -> list[str]:
    return list(dict.fromkeys([*RATES, *args.rates]))


def finished_runs(work: Path, args: argparse.Namespace) -> dict[tuple[str, str], Pooled]:
    """Every finished run in the work folder (its summary written), pooled by mode and learning rate."""
    results: dict[tuple[str, str], Pooled] = {}
    for rate in all_rates(args):
        for mode in modes(args.budget):
            for run in sorted(work.glob(f"{slug(mode, rate)}-*")):
                if (run / "summary.json").is_file():
                    read_run(run, results.setdefault((mode.name, rate), Pooled()))
    return results


def report(args: argparse.Namespace, work: Path) -> None:
    """Print and write the table of every finished run (rewritten after every run: always whole)."""
    results = finished_runs(work, args)
    names = [mode.name for mode in modes(args.budget)]
    reference = {rate: statistics.median(p.step_seconds) for (name, rate), p in results.items() if name == "HF gather"}
    rows = [row(name, rate, pooled, reference.get(rate)) for (name, rate), pooled in
            sorted(results.items(), key=lambda item: (all_rates(args).index(item[0][1]), names.index(item[0][0])))]
    runs = sum(1 for run in work.glob("*/summary.json"))
    title = (f"PPO, smoke policy, bf16, 2 CPU processes under ZeRO-3, {args.rollouts} x {args.completion_length} "
             f"sampled tokens per rank per step, {args.steps} steps a run, {runs} runs")
    print_table(title, COLUMNS, rows)
    panels = [(f"s/step gen + sync, lr {rate}", {name: statistics.median(p.step_seconds)
                                                for (name, r), p in results.items() if r == rate})
              for rate in all_rates(args) if any(r == rate for _, r in results)]
    bar_charts(args.out / "vllm.png", title, panels)
    loads = (work / "loads.txt").read_text().splitlines()
    busiest = max(float(reading.split(" / ")[0]) for reading in loads)
    shared = "other work shared the machine" if busiest > BUSY_LOAD else "no other work to speak of"
    note = (f"Values: median (min-max) over every step after the first of every run. Load average (1 / 5 / 15 min) "
            f"at the first run's start {loads[0]}, when last recorded {loads[-1]}, at most {busiest:.1f} after any "
            f"run on {os.cpu_count()} cores ({shared}).")
    write_markdown(args.out / "vllm.md", f"# {title}\n\n{markdown_table(COLUMNS, rows)}\n{note}\n\n"
                   "![vllm](vllm.png)\n")


def main() -> None:
    parser = benchmark_parser(__doc__, "PPO updates per run (one generation call and one sync each)")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved rounds of every mode at every rate")
    parser.add_argument("--rates", nargs="+", default=RATES, help="learning rates")
    parser.add_argument("--rollouts", type=int, default=4, help="responses per rank per step (even)")
    parser.add_argument("--budget", default="0.5", help="the HF run's gather budget")
    parser.add_argument("--only", nargs="*", help="run only these modes, adding to the runs in the work folder")
    parser.add_argument("--report-only", action="store_true", help="write the table of the finished runs, run none")
    args = parser.parse_args()
    if args.report_only:
        return report(args, args.work_dir / "runs" / "vllm")
    chosen = [mode for mode in modes(args.budget) if not args.only or mode.name in args.only]
    work = args.work_dir / "runs" / "vllm"
    if not args.only:
        shutil.rmtree(work, ignore_errors=True)  # a rerun starts clean
    work.mkdir(parents=True, exist_ok=True)
    with (work / "loads.txt").open("a") as loads:
        loads.write(load() + "\n")
    serving = any(mode.name == SERVER for mode in chosen)
    serve = ("ppo", "-r", str(RECIPE), "--set", "bf16=true")  # the runs' policy, in bf16
    with vllm_server(work / "server.log", *serve) if serving else socket_port() as url:
        for repeat in range(args.repeats):
            for rate in args.rates:
                for mode in chosen:
                    out = work / f"{slug(mode, rate)}-{repeat}"
                    extra = ("--set", f"vllm_server_base_url={url}") if mode.name == SERVER else ()
                    print(f"round {repeat + 1}: {mode.name}, lr {rate} ...", flush=True)
                    shutil.rmtree(out, ignore_errors=True)  # never a half-written run read back
                    run_timed(python_module("rlhf_cli", "ppo", *run_flags(mode, rate, args.steps,
                                                                         args.completion_length, args.rollouts),
                                            *extra, "-o", str(out), "--overwrite"),
                              env={"RLHF_PROBE_GENERATION": "1", **VLLM_ENV}, timeout=1800)
                    with (work / "loads.txt").open("a") as loads:
                        loads.write(load() + "\n")
                    report(args, work)


if __name__ == "__main__":
    main()
