"""HF generation under ZeRO-3 against colocated vLLM: seconds per generation step, and the weight sync's cost.

The generation benchmark's random 100M Llama (benchmarks/generation.py), trained by `rlhf ppo` with 2 CPU
processes for a few steps, the same batch and the same number of sampled tokens in every run (no stop token:
every response is `--completion-length` tokens). Runs:

- HF `generate` with `--gather`, `--gather-budget B` and `--no-gather` (seconds per call from the generation
  probe, RLHF_PROBE_GENERATION=1, gathering included);
- vLLM colocate (`--set use_vllm=true`), its weights synced after every update under `--gather` (one bucket),
  each `--sync-budgets` fraction, and `--no-gather` (one unit a bucket); seconds per generation call and per
  sync, and the most policy bytes held gathered at once during a sync, from `ranks/rank-N.json`.

Medians over the calls after the first (which builds caches). Needs vLLM: run it with the interpreter that has it,

    /path/to/venv-with-vllm/bin/python benchmarks/vllm.py [--steps 3] [--out benchmarks/results]
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from _common import (
    MIB,
    RECIPES,
    bar_charts,
    benchmark_model,
    benchmark_parser,
    markdown_table,
    print_table,
    python_module,
    run_timed,
    write_markdown,
)

RECIPE = RECIPES / "ppo" / "smoke.yaml"


@dataclass(frozen=True)
class Mode:
    name: str
    flags: tuple[str, ...]


def modes(budget: str, sync_budgets: list[str]) -> list[Mode]:
    vllm = ("--set", "use_vllm=true")
    return [Mode("HF gather", ("--gather",)), Mode(f"HF budget {budget}", ("--gather-budget", budget)),
            Mode("HF no-gather", ("--no-gather",)), Mode("vLLM, sync gather", (*vllm, "--gather")),
            *(Mode(f"vLLM, sync budget {size}", (*vllm, "--gather-budget", size)) for size in sync_budgets),
            Mode("vLLM, sync no-gather", (*vllm, "--no-gather"))]


def run_flags(mode: Mode, model: Path, steps: int, completion_length: int, rollouts: int) -> list[str]:
    batch = ("--set", "per_device_train_batch_size=2", "--set", f"gradient_accumulation_steps={rollouts // 2}",
             "--set", f"local_rollout_forward_batch_size={rollouts}", "--set", "num_ppo_epochs=1")
    return ["-r", str(RECIPE), "--model", str(model), "--max-steps", str(steps),
            "--set", f"response_length={completion_length}", "--set", "stop_token=null",
            "--set", "missing_eos_penalty=null", *batch, *mode.flags]


@dataclass(frozen=True)
class Measured:
    generation_seconds: float  # median per call, after the first, mean over ranks
    sync_seconds: float | None = None
    sync_peak_bytes: int | None = None  # max over ranks and syncs
    full_bytes: int | None = None
    buckets: int | None = None


def _median_after_first(values: list[float]) -> float:
    return statistics.median(values[1:] if len(values) > 1 else values)


def measured(run: Path) -> Measured:
    records = [json.loads(path.read_text()) for path in sorted((run / "ranks").glob("rank-*.json"))
               if re.fullmatch(r"rank-\d+\.json", path.name)]
    if records[0].get("vllm_generation_seconds") is None:
        seconds = [_median_after_first([call["seconds"] for call in r["generation_probe"]["per_call"]])
                   for r in records]
        return Measured(statistics.mean(seconds))
    syncs = [sync for record in records for sync in record["vllm_sync"]]
    return Measured(statistics.mean(_median_after_first(r["vllm_generation_seconds"]) for r in records),
                    statistics.median(sync["seconds"] for sync in syncs), max(sync["peak_bytes"] for sync in syncs),
                    syncs[0]["full_bytes"], syncs[0]["buckets"])


def row(mode: Mode, result: Measured, reference: float) -> list[str]:
    sync = ["", "", ""]
    if result.sync_seconds is not None:
        share = result.sync_peak_bytes / result.full_bytes
        sync = [f"{result.sync_seconds:.2f}", f"{result.sync_peak_bytes / MIB:.1f} ({share:.2f})", str(result.buckets)]
    return [mode.name, f"{result.generation_seconds:.2f}", f"{reference / result.generation_seconds:.2f}", *sync]


COLUMNS = ["mode", "gen s/step", "speed vs HF gather", "sync s", "sync peak MiB (share)", "sync buckets"]


def main() -> None:
    parser = benchmark_parser(__doc__, "PPO updates per run (one generation call each)")
    parser.add_argument("--rollouts", type=int, default=8, help="responses per rank per step (even)")
    parser.add_argument("--budget", default="0.5", help="the HF run's gather budget")
    parser.add_argument("--sync-budgets", nargs="*", default=["0.5", "0.25"], help="the vLLM runs' sync budgets")
    parser.add_argument("--only", nargs="*", help="run only the modes of these names (the table: all run so far)")
    parser.add_argument("--reuse-runs", action="store_true", help="read a mode's finished run instead of running it")
    args = parser.parse_args()
    model, parameters = benchmark_model(args.work_dir)
    results: dict[Mode, Measured] = {}
    for mode in modes(args.budget, args.sync_budgets):
        out = args.work_dir / "runs" / f"vllm-{re.sub('[^a-z0-9]+', '-', mode.name.lower()).strip('-')}"
        finished = (out / "ranks" / "rank-0.json").is_file()
        if (args.reuse_runs or args.only is not None) and finished and not (args.only and mode.name in args.only):
            results[mode] = measured(out)
            continue
        if args.only is not None and mode.name not in args.only:
            continue
        print(f"running {mode.name} ...", flush=True)
        flags = run_flags(mode, model, args.steps, args.completion_length, args.rollouts)
        run_timed(python_module("rlhf_cli", "ppo", *flags, "-o", str(out), "--overwrite"),
                  env={"RLHF_PROBE_GENERATION": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}, timeout=1800)
        results[mode] = measured(out)

    reference = next(result for mode, result in results.items() if mode.name == "HF gather").generation_seconds
    rows = [row(mode, result, reference) for mode, result in results.items()]
    title = (f"PPO generation, HF vs colocated vLLM, 2 CPU processes under ZeRO-3, {parameters / 1e6:.0f}M Llama "
             f"(fp32), {args.rollouts} x {args.completion_length} sampled tokens per rank per step, {args.steps} steps")
    print_table(title, COLUMNS, rows)
    vllm_gather = next(result for mode, result in results.items() if mode.name == "vLLM, sync gather")
    ratio = f"Generation speed ratio vLLM / HF gather: {reference / vllm_gather.generation_seconds:.2f}x."
    print(ratio)
    panels = [("generation seconds per step (mean over ranks)",
               {mode.name: result.generation_seconds for mode, result in results.items()}),
              ("sync seconds (median)", {mode.name: result.sync_seconds for mode, result in results.items()
                                         if result.sync_seconds is not None}),
              ("sync peak gathered MiB (max over ranks)",
               {mode.name: result.sync_peak_bytes / MIB for mode, result in results.items()
                if result.sync_peak_bytes is not None})]
    bar_charts(args.out / "vllm.png", title, panels)
    write_markdown(args.out / "vllm.md", f"# {title}\n\n{markdown_table(COLUMNS, rows)}\n{ratio}\n\n"
                   "![vllm](vllm.png)\n")


if __name__ == "__main__":
    main()
