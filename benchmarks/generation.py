"""Gather vs no-gather under ZeRO-3: what generation costs each rank.

Builds a random-weight Llama of about 100M parameters from the smoke policy's config and tokenizer
(scaled up; the 500-token vocabulary keeps the embeddings small), runs `rlhf rloo` on it with 2 CPU
processes in each mode with the generation probe on (RLHF_PROBE_GENERATION=1), and reads what each
rank recorded in `ranks/rank-N.json`:

- gathered peak: the most ZeRO-3 parameter bytes gathered (or being gathered: a prefetched parameter
  already holds its full buffer) on the rank at once while generating, and their share of the model;
- RSS rise: the largest rise of the rank's resident memory within one generation call, above its
  resident memory at the call's start (RSS peak: the largest resident memory itself);
- generation seconds per step (gathering and releasing included);
- all-gather collectives launched per generation call (median over the calls).

No-gather runs twice: with DeepSpeed's defaults (stage3_max_live_parameters=1e9, more than the whole
model, so it may keep nearly all of it live) and with bounded ZeRO-3 knobs (--max-live, --prefetch-bucket).
Beside them, what `rlhf plan rloo <the same flags> --json` predicts for the run's own configuration: its
`gen weights` row (the full policy when gathering, else what ZeRO-3 keeps live and prefetches) against the
gathered peak, with the error in percent; and, loosely, `gen weights` + `gen KV cache` against the RSS rise.

    python benchmarks/generation.py [--steps 3] [--repeats 1] [--out benchmarks/results]
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from _common import (
    MIB,
    RECIPES,
    CommandFailed,
    RankGeneration,
    bar_charts,
    benchmark_model,
    benchmark_parser,
    json_output,
    markdown_table,
    print_table,
    python_module,
    rank_generations,
    run_timed,
    write_markdown,
)

RECIPE = RECIPES / "rloo" / "smoke.yaml"


@dataclass(frozen=True)
class Mode:
    name: str
    flags: tuple[str, ...]

    @property
    def gathers(self) -> bool:
        return "--gather" in self.flags


def modes(max_live: int, prefetch_bucket: int) -> list[Mode]:
    bounded = ("--set", f"stage3_max_live_parameters={max_live}",
               "--set", f"stage3_prefetch_bucket_size={prefetch_bucket}")
    return [Mode("gather", ("--gather",)),
            Mode("no-gather (DeepSpeed defaults)", ("--no-gather",)),
            Mode("no-gather (bounded)", ("--no-gather", *bounded))]


@dataclass(frozen=True)
class Planned:
    """What `rlhf plan` predicts for the generation phase of one run, per GPU (here: per rank), in bytes."""

    weights: int  # the policy's parameters held gathered: the full copy (gather), or live + prefetched
    kv_cache: int
    element_bytes: int  # bytes per parameter the plan assumed

    @property
    def generation(self) -> int:
        return self.weights + self.kv_cache


def plan_prediction(flags: list[str]) -> Planned:
    """Ask `rlhf plan rloo` about exactly the run's flags and read its own (chosen) configuration's generation rows."""
    plan = json_output(run_timed(python_module("rlhf_cli", "plan", "rloo", *flags, "--json"), timeout=120).output)
    if not plan["known"]:
        raise CommandFailed(f"rlhf plan could not plan the run: {plan['why_unknown']}")
    chosen = next(column for column in plan["configurations"] if column["chosen"])
    rows = chosen["components"]
    return Planned(rows["gen weights"], rows["gen KV cache"], plan["workload"]["element_bytes"])


def run_mode(mode: Mode, model: Path, work: Path, steps: int, completion_length: int, repeat: int) -> Path:
    out = work / "runs" / f"{re.sub('[^a-z]+', '-', mode.name.lower()).strip('-')}-{repeat}"
    return run_rloo(run_flags(mode, model, steps, completion_length), out)


def run_rloo(flags: list[str], out: Path) -> Path:
    """`rlhf rloo FLAGS -o OUT` with the generation probe on; returns OUT."""
    run_timed(python_module("rlhf_cli", "rloo", *flags, "-o", str(out), "--overwrite"),
              env={"RLHF_PROBE_GENERATION": "1"})
    return out


def run_flags(mode: Mode, model: Path, steps: int, completion_length: int) -> list[str]:
    return ["-r", str(RECIPE), "--model", str(model), "--max-steps", str(steps),
            "--set", f"max_completion_length={completion_length}", *mode.flags]


def mib(value: float) -> str:
    return f"{value / MIB:.1f}"


def checked_dtype(planned: Planned, ranks: list[RankGeneration], mode: Mode) -> None:
    """The plan must count the bytes per parameter the ranks really hold, or its numbers compare nothing."""
    held = {rank.element_bytes for rank in ranks}
    if held != {planned.element_bytes}:
        raise CommandFailed(f"{mode.name}: rlhf plan counts {planned.element_bytes} bytes per parameter, "
                            f"the ranks hold {sorted(held)}")


def main() -> None:
    parser = benchmark_parser(__doc__, "training steps per run (one generation call each)")
    parser.add_argument("--repeats", type=int, default=1, help="runs per mode; their calls are pooled")
    parser.add_argument("--max-live", type=int, default=20_000_000,
                        help="stage3_max_live_parameters of the bounded no-gather run (about 3 layers)")
    parser.add_argument("--prefetch-bucket", type=int, default=7_000_000,
                        help="stage3_prefetch_bucket_size of the bounded no-gather run (about 1 layer)")
    args = parser.parse_args()
    model, parameters = benchmark_model(args.work_dir)

    all_modes = modes(args.max_live, args.prefetch_bucket)
    plans = {mode: plan_prediction(run_flags(mode, model, args.steps, args.completion_length)) for mode in all_modes}
    rows: list[list[str]] = []
    chart: dict[str, dict[str, float]] = {label: {} for label in CHART_PANELS}
    predicted: dict[str, dict[str, float]] = {GATHERED_PANEL: {}, RSS_PANEL: {}}
    for mode in all_modes:
        print(f"running {mode.name} ...", flush=True)
        runs = [run_mode(mode, model, args.work_dir, args.steps, args.completion_length, repeat)
                for repeat in range(args.repeats)]
        ranks = rank_generations(runs)
        planned = plans[mode]
        checked_dtype(planned, ranks, mode)
        rows += [row(mode.name, rank, planned) for rank in ranks]
        for label, value in chart_values(ranks).items():
            chart[label][mode.name] = value
        predicted[GATHERED_PANEL][mode.name] = planned.weights / MIB
        predicted[RSS_PANEL][mode.name] = planned.generation / MIB

    title = (f"Generation under ZeRO-3, 2 CPU processes, {parameters / 1e6:.0f}M-parameter Llama (fp32), "
             f"{args.steps} steps x {args.repeats}, {args.completion_length} completion tokens")
    print_table(title, COLUMNS, rows)
    bar_charts(args.out / "generation.png", title, list(chart.items()), predicted, "rlhf plan")
    settings = (f"Bounded no-gather: `--set stage3_max_live_parameters={args.max_live} "
                f"--set stage3_prefetch_bucket_size={args.prefetch_bucket}`. The other runs set no ZeRO-3 knob, so "
                f"DeepSpeed's defaults apply: stage3_max_live_parameters 1e9, stage3_prefetch_bucket_size 5e7, "
                f"stage3_param_persistence_threshold 1e5 (accelerate sizes them from the model only when a "
                f"DeepSpeed config file says `auto`).")
    plan_note = (f"Plan: `rlhf plan rloo <the run's flags> --json`, the run's own configuration; it counted "
                 f"{plans[all_modes[0]].element_bytes} bytes a parameter, as the ranks held. \"plan weights\" is its "
                 f"`gen weights` row, compared with the gathered peak (error = (plan - measured) / measured). "
                 f"\"plan weights + KV\" adds its `gen KV cache` row (prompts counted at the model's length limit): "
                 f"a GPU estimate, shown beside the CPU's RSS rise only loosely.")
    write_markdown(args.out / "generation.md", f"# {title}\n\n{markdown_table(COLUMNS, rows)}\n{settings}\n\n"
                   f"{plan_note}\n\n![generation](generation.png)\n")


COLUMNS = ["mode", "rank", "gen s/step", "all-gathers/call", "gathered peak MiB (share)", "plan weights MiB",
           "plan error %", "RSS rise MiB", "plan weights + KV MiB (loose)", "RSS peak MiB"]
GATHERED_PANEL = "gathered parameters peak (MiB, max over ranks); plan: gen weights"
RSS_PANEL = "RSS rise in generation (MiB, max over ranks); plan, loosely: gen weights + KV"
CHART_PANELS = (GATHERED_PANEL, RSS_PANEL, "generation seconds per step (mean over ranks)",
                "all-gathers per generation call (max over ranks)")


def chart_values(ranks: list[RankGeneration]) -> dict[str, float]:
    gathered, rss, seconds, all_gathers = CHART_PANELS
    return {gathered: max(r.gathered_peak_bytes for r in ranks) / MIB,
            rss: max(r.rss_peak_delta_bytes for r in ranks) / MIB,
            seconds: sum(r.seconds_per_step for r in ranks) / len(ranks),
            all_gathers: max(r.all_gathers_per_call for r in ranks)}


def row(mode: str, rank: RankGeneration, planned: Planned) -> list[str]:
    measured = rank.gathered_peak_bytes
    return [mode, str(rank.rank), f"{rank.seconds_per_step:.2f}", f"{rank.all_gathers_per_call:g}",
            f"{mib(measured)} ({rank.gathered_peak_share:.2f})", mib(planned.weights),
            f"{100 * (planned.weights - measured) / measured:+.1f}", mib(rank.rss_peak_delta_bytes),
            mib(planned.generation), mib(rank.rss_peak_bytes)]


if __name__ == "__main__":
    main()
