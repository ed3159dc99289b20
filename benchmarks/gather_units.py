"""What each part of the policy costs ZeRO-3 per generated token, and so which parts a gather budget buys first.

A gather budget (rlhf_cli/gather_budget.py) buys units of the policy: decoder layers, the embedding, the LM head,
the final norm. Gathered once per call and run without ZeRO-3's hooks, a unit saves each generated token two
costs: a fixed one per module it holds (ZeRO-3's hooks run around every module: fetch, release, trace
bookkeeping) and one per byte (all-gathering its parameters). Measured here on the 100M-parameter Llama of
`generation.py`, 2 CPU processes, greedy decoding of the same prompts, through the gather budget's own mechanism
(`rlhf_cli.rank.zero3.gathered_units`), every configuration `--repeats` times, interleaved; medians:

- hooks: an engine whose parameters are all persistent (stage3_param_persistence_threshold above the largest),
  so that ZeRO-3 fetches nothing: generation with every hook against with no hook (every unit "gathered", which
  gathers nothing): the hooks' own time per module per forward;
- units: the engine of generation.py's bounded no-gather run (stage3_max_live_parameters 2e7,
  stage3_prefetch_bucket_size 7e6): generation time with one kind of unit gathered against nothing gathered:
  the seconds saved per generated token, in all and per MiB the unit holds; less the hooks' share, per byte.

It also checks that every configuration generates the same tokens.

    python benchmarks/gather_units.py [--repeats 5] [--new-tokens 16] [--batch 4] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from _common import MIB, REPO, RESULTS, WORK, CommandFailed, markdown_table, print_table, write_markdown

MAX_LIVE, PREFETCH_BUCKET = 20_000_000, 7_000_000
ALL = "*"
# Configurations of the bounded engine: a name and the units (as rlhf_cli.rank.zero3.policy_units names
# them) gathered once.
UNIT_CONFIGURATIONS = {
    "nothing": (),
    "embedding": ("model.embed_tokens",),
    "LM head": ("lm_head",),
    "embedding + LM head": ("model.embed_tokens", "lm_head"),
    "1 decoder layer": ("model.layers.0",),
    "2 decoder layers": ("model.layers.0", "model.layers.1"),
    "4 decoder layers": tuple(f"model.layers.{i}" for i in range(4)),
}
# Configurations of the all-persistent engine: every hook, or none.
HOOK_CONFIGURATIONS = {"hooks on": (), "hooks off": (ALL,)}


def worker(args: argparse.Namespace) -> None:
    """One rank: build both engines, time every configuration, and (rank 0) write the raw numbers as JSON."""
    import deepspeed
    import torch
    from transformers import AutoModelForCausalLM

    from rlhf_cli.rank.zero3 import gathered_units, policy_units

    deepspeed.init_distributed(dist_backend="gloo")

    def engine(zero: dict[str, Any]) -> Any:
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
        model.generation_config.eos_token_id = None  # every rank runs exactly new_tokens forwards
        config = {"train_micro_batch_size_per_gpu": 1, "zero_allow_untested_optimizer": True,
                  "zero_optimization": {"stage": 3, **zero}}
        built, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters()), config=config)
        return built

    bounded = engine({"stage3_max_live_parameters": MAX_LIVE, "stage3_prefetch_bucket_size": PREFETCH_BUCKET})
    persistent = engine({"stage3_param_persistence_threshold": 10**10})
    engines = {**{name: bounded for name in UNIT_CONFIGURATIONS}, **{name: persistent for name in HOOK_CONFIGURATIONS}}
    units = {id(built): {unit.unit.name: unit for unit in policy_units(built.module)}
             for built in (bounded, persistent)}
    configurations = {**UNIT_CONFIGURATIONS, **HOOK_CONFIGURATIONS}
    vocab = bounded.module.config.vocab_size
    prompts = torch.randint(3, vocab, (args.batch, 16), generator=torch.Generator().manual_seed(1))

    def timed(name: str) -> tuple[float, list[list[int]]]:
        built = engines[name]
        own = units[id(built)]
        chosen = list(own.values()) if configurations[name] == (ALL,) else [own[unit] for unit in configurations[name]]
        torch.distributed.barrier()
        started = time.perf_counter()
        with torch.no_grad(), gathered_units(built, chosen):
            tokens = built.module.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=False,
                                           max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens)
        torch.distributed.barrier()
        return time.perf_counter() - started, tokens.tolist()

    names = list(configurations)
    for name in ("nothing", "hooks on"):
        timed(name)  # warm-up: allocations, the first fetch trace
    seconds: dict[str, list[float]] = defaultdict(list)
    outputs: dict[str, list[list[int]]] = {}
    for repeat in range(args.repeats):
        for name in names[repeat % len(names):] + names[:repeat % len(names)]:  # interleaved, rotated
            took, outputs[name] = timed(name)
            seconds[name].append(took)
    if torch.distributed.get_rank() == 0:
        result = {"seconds": seconds, "same_tokens": all(out == outputs["nothing"] for out in outputs.values()),
                  "units": {name: {"numel": unit.unit.numel, "modules": unit.unit.modules,
                                   "bytes": sum(p.ds_numel * p.element_size() for p in unit.params)}
                            for name, unit in units[id(bounded)].items()},
                  "modules": sum(1 for _ in bounded.module.modules()),
                  "new_tokens": args.new_tokens, "batch": args.batch, "repeats": args.repeats}
        Path(args.raw).write_text(json.dumps(result))


def report(raw: dict[str, Any], out: Path) -> None:
    tokens = raw["new_tokens"]
    median = {name: statistics.median(times) for name, times in raw["seconds"].items()}
    unhooked = sum(unit["modules"] for unit in raw["units"].values())
    hook = (median["hooks on"] - median["hooks off"]) / (unhooked * tokens)  # seconds per module per forward
    rows, parts = [], {}
    for name, unit_names in UNIT_CONFIGURATIONS.items():
        held = sum(raw["units"][unit]["bytes"] for unit in unit_names) / MIB
        modules = sum(raw["units"][unit]["modules"] for unit in unit_names)
        saved = (median["nothing"] - median[name]) / tokens
        spread = f"{min(raw['seconds'][name]):.2f}-{max(raw['seconds'][name]):.2f}"
        row = [name, f"{held:.2f}", str(modules), f"{median[name]:.2f} ({spread})"]
        if unit_names:
            parts[name] = (1000 * modules * hook / held, 1000 * (saved - modules * hook) / held)
            row += [f"{1000 * saved:+.1f}", f"{1000 * saved / held:+.2f}", f"{parts[name][0]:.2f}",
                    f"{parts[name][1]:+.2f}"]
        rows.append(row + [""] * (8 - len(row)))
    title = (f"Gathered once, per unit: {raw['batch']} prompts x {tokens} new tokens, 2 CPU processes, ZeRO-3 "
             f"(max live {MAX_LIVE:.0e}, prefetch {PREFETCH_BUCKET:.0e}), medians of {raw['repeats']} interleaved")
    columns = ["gathered once", "MiB", "modules", "gen s/call (range)", "saved ms/token", "saved ms/token per MiB",
               "hooks' share per MiB", "bytes' share per MiB"]
    print_table(title, columns, rows)
    hooks = (f"ZeRO-3's hooks alone (every parameter persistent, nothing fetched): {median['hooks on']:.2f} s per call "
             f"with every hook, {median['hooks off']:.2f} s with the {unhooked} modules of all units unhooked: "
             f"{1e6 * hook:.0f} us per module per forward. Same tokens in every configuration: {raw['same_tokens']}.")
    print(hooks)
    plot(raw, median, parts, out / "gather_units.png")
    write_markdown(out / "gather_units.md", f"# {title}\n\n{markdown_table(columns, rows)}\n{hooks}\n\n"
                   f"![gather units](gather_units.png)\n")


def plot(raw: dict[str, Any], median: dict[str, float], parts: dict[str, tuple[float, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5))
    names = list(UNIT_CONFIGURATIONS)
    for index, name in enumerate(names):
        left.scatter([index] * len(raw["seconds"][name]), raw["seconds"][name], s=10, color="#8c8c8c")
    left.bar(range(len(names)), [median[name] for name in names], color="#4c72b0", alpha=0.7)
    left.set_xticks(range(len(names)), names, rotation=15, ha="right")
    left.set_title("generation s per call (bars: medians, dots: repeats)", fontsize=10)
    bought = list(parts)
    hooks = [parts[name][0] for name in bought]
    left_over = [parts[name][1] for name in bought]
    right.bar(range(len(bought)), hooks, color="#dd8452", label="ZeRO-3 hooks (measured apart)")
    right.bar(range(len(bought)), left_over, bottom=hooks, color="#4c72b0", label="the rest: fetching the bytes")
    right.set_xticks(range(len(bought)), bought, rotation=15, ha="right")
    right.set_title("generation ms saved per token per MiB gathered once", fontsize=10)
    right.legend(fontsize=9)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--work-dir", type=Path, default=WORK)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--raw", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    from generation import build_model

    model = args.work_dir / "llama-100m"
    build_model(model)
    raw_path = args.work_dir / "gather_units.json"
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", __file__, "--worker",
            "--model", str(model), "--raw", str(raw_path), "--repeats", str(args.repeats),
            "--new-tokens", str(args.new_tokens), "--batch", str(args.batch)]
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise CommandFailed(f"the ranks exited {done.returncode}:\n{(done.stdout + done.stderr)[-4000:]}")
    report(json.loads(raw_path.read_text()), args.out)


if __name__ == "__main__":
    main()
