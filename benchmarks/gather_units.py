"""What each part of the policy costs ZeRO-3 per generated token, and so which parts a gather budget buys first.

A gather budget (rlhf_cli/generation/budget.py) buys units of the policy: decoder layers, the embedding, the LM head,
the final norm. Gathered once per call and run without ZeRO-3's hooks, a unit saves at every generated token
what ZeRO-3 spends on it: its hooks around every module, and fetching and releasing its parameters. This script
measures that per module kind on the 100M-parameter Llama of `generation.py` (2 CPU processes, fp32, one ZeRO-3
engine): one decode step (4 sequences, 1 token) through the module, `--calls` times in a row, with ZeRO-3's
hooks (parameters fetched and released at every call, as without gathering) against the same module gathered
once through the gather budget's own mechanism (`rlhf_cli.rank.zero3.gathered_units`: no hooks, no fetch); the
difference per call is what gathering it saves per token. Every kind is measured `--repeats` times, interleaved;
medians. A least-squares line over the single modules with parameters splits the cost into a fixed part per
module and a part per MiB fetched; the modules without partitioned parameters (the activation, the norms, which
ZeRO-3 keeps whole) cost the hooks alone.

The fetch here is on demand (the coordinator's trace stays invalid, so nothing is prefetched): on the CPU
DeepSpeed's all-gathers are synchronous, so prefetching moves the same work, it does not hide it.

    python benchmarks/gather_units.py [--repeats 9] [--calls 20] [--out benchmarks/results]
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

BATCH = 4
# A Llama decoder layer: 7 projections, 2 norms (ZeRO-3 keeps them whole), 4 modules without parameters (the
# layer, attention, MLP, activation).
LAYER_LINEARS, LAYER_NORMS, LAYER_WITHOUT_PARAMETERS = 7, 2, 4
# Module kinds: a name, the module's path in LlamaForCausalLM, and what it takes for one decode step.
KINDS = {
    "activation (no parameters)": "model.layers.0.mlp.act_fn",
    "final norm (whole on every rank)": "model.norm",
    "embedding": "model.embed_tokens",
    "LM head": "lm_head",
    "attention projection (q_proj)": "model.layers.0.self_attn.q_proj",
    "MLP projection (gate_proj)": "model.layers.0.mlp.gate_proj",
    "decoder layer (13 modules)": "model.layers.0",
}


def worker(args: argparse.Namespace) -> None:
    """One rank: time every kind with and without ZeRO-3's hooks; rank 0 writes the raw numbers as JSON."""
    import deepspeed
    import torch
    from transformers import AutoModelForCausalLM

    from rlhf_cli import compat
    from rlhf_cli.generation.budget import Unit
    from rlhf_cli.rank.zero3 import ModuleUnit, gathered_units

    deepspeed.init_distributed(dist_backend="gloo")
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    config = {"train_micro_batch_size_per_gpu": 1, "zero_allow_untested_optimizer": True,
              "zero_optimization": {"stage": 3}}
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters()), config=config)
    modules = dict(engine.module.named_modules())
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(BATCH, 1, model.config.hidden_size, generator=generator)
    tokens = torch.randint(3, model.config.vocab_size, (BATCH, 1), generator=generator)
    with torch.no_grad():
        rotary = engine.module.model.rotary_emb(hidden, torch.zeros(BATCH, 1, dtype=torch.long))
    inputs = {"model.embed_tokens": lambda: (tokens,), "model.layers.0": lambda: (hidden,)}
    extra = {"model.layers.0": {"position_embeddings": rotary}}

    def calls(path: str) -> float:
        module = modules[path]
        torch.distributed.barrier()
        started = time.perf_counter()
        with torch.no_grad():
            for _ in range(args.calls):
                module(*inputs.get(path, lambda: (hidden,))(), **extra.get(path, {}))
        torch.distributed.barrier()
        return (time.perf_counter() - started) / args.calls

    def unit(path: str) -> ModuleUnit:
        module = modules[path]
        params = tuple(module.parameters())
        return ModuleUnit(Unit(path, sum(p.ds_numel for p in params), sum(1 for _ in module.modules())),
                          (module,), params)

    compat.invalidate_fetch_trace(engine)  # on demand, nothing prefetched, and it stays so: no root forward
    for path in KINDS.values():
        calls(path)  # warm-up
    hooked: dict[str, list[float]] = defaultdict(list)
    gathered: dict[str, list[float]] = defaultdict(list)
    names = list(KINDS)
    for repeat in range(args.repeats):
        for name in names[repeat % len(names):] + names[:repeat % len(names)]:  # interleaved, rotated
            hooked[name].append(calls(KINDS[name]))
            with gathered_units(engine, [unit(KINDS[name])]):
                gathered[name].append(calls(KINDS[name]))
    if torch.distributed.get_rank() == 0:
        result = {"hooked": hooked, "gathered": gathered, "calls": args.calls, "repeats": args.repeats,
                  "kinds": {name: {"modules": unit(path).unit.modules,
                                   "bytes": sum(p.ds_numel * p.element_size() for p in unit(path).params
                                                if not p.ds_persist)}
                            for name, path in KINDS.items()}}
        Path(args.raw).write_text(json.dumps(result))


def fit_line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares y = a + b x."""
    n = len(points)
    mean_x, mean_y = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sum((x - mean_x) ** 2 for x, _ in points)
    return mean_y - slope * mean_x, slope


def report(raw: dict[str, Any], out: Path) -> None:
    saved = {name: statistics.median(h - g for h, g in zip(raw["hooked"][name], raw["gathered"][name], strict=True))
             for name in KINDS}  # each round's own difference
    kinds = raw["kinds"]
    single = [name for name in KINDS if kinds[name]["bytes"] and kinds[name]["modules"] == 1]
    fixed, per_mib = fit_line([(kinds[name]["bytes"] / MIB, saved[name]) for name in single])
    layer = "decoder layer (13 modules)"
    predicted = (LAYER_LINEARS * fixed + per_mib * kinds[layer]["bytes"] / MIB
                 + LAYER_NORMS * saved["final norm (whole on every rank)"]
                 + LAYER_WITHOUT_PARAMETERS * saved["activation (no parameters)"])
    rows = []
    for name in KINDS:
        mib = kinds[name]["bytes"] / MIB
        rows.append([name, str(kinds[name]["modules"]), f"{mib:.2f}",
                     f"{1000 * statistics.median(raw['hooked'][name]):.3f}",
                     f"{1000 * statistics.median(raw['gathered'][name]):.3f}", f"{1000 * saved[name]:.3f}",
                     f"{1000 * saved[name] / mib:.3f}" if mib else "",
                     f"{1000 * saved[name] / kinds[name]['modules']:.3f}"])
    title = (f"ZeRO-3's cost per module kind and decode step ({BATCH} sequences x 1 token), 2 CPU processes, "
             f"medians of {raw['repeats']} interleaved rounds of {raw['calls']} calls")
    columns = ["module kind", "modules", "MiB fetched", "ms/call, ZeRO-3 hooks", "ms/call, gathered once",
               "saved ms/call", "saved ms/call per MiB", "saved ms/call per module"]
    print_table(title, columns, rows)
    line = (f"Least squares over the single modules with parameters ({', '.join(single)}): "
            f"{1000 * fixed:.3f} ms per module + {1000 * per_mib:.3f} ms per MiB fetched. A decoder layer from it "
            f"and the first two rows ({LAYER_LINEARS} projections, {LAYER_NORMS} norms, {LAYER_WITHOUT_PARAMETERS} "
            f"modules without parameters): {1000 * predicted:.1f} ms; measured {1000 * saved[layer]:.1f} ms.")
    print(line)
    plot(kinds, saved, fixed, per_mib, single, out / "gather_units.png")
    write_markdown(out / "gather_units.md", f"# {title}\n\n{markdown_table(columns, rows)}\n{line}\n\n"
                   f"![gather units](gather_units.png)\n")


def plot(kinds: dict, saved: dict[str, float], fixed: float, per_mib: float, single: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5))
    for name in KINDS:
        mib = kinds[name]["bytes"] / MIB
        if kinds[name]["modules"] == 1:
            left.scatter([mib], [1000 * saved[name]], s=25)
            left.annotate(name, (mib, 1000 * saved[name]), fontsize=8, xytext=(4, 4), textcoords="offset points")
    top = max(kinds[name]["bytes"] / MIB for name in single)
    left.plot([0, top], [1000 * fixed, 1000 * (fixed + per_mib * top)], "--", color="#c44e52",
              label="least squares over the modules with parameters")
    left.set_xlabel("MiB fetched per call")
    left.set_ylabel("ms saved per call (per token)")
    left.set_title("one module: ZeRO-3's cost per decode step", fontsize=10)
    left.legend(fontsize=8)
    bought = [name for name in KINDS if kinds[name]["bytes"]]
    bars = right.bar(range(len(bought)), [1000 * saved[name] / (kinds[name]["bytes"] / MIB) for name in bought],
                     color="#4c72b0")
    right.bar_label(bars, fmt="%.3g")
    right.set_xticks(range(len(bought)), bought, rotation=15, ha="right")
    right.set_title("ms saved per token per MiB gathered once", fontsize=10)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--work-dir", type=Path, default=WORK)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--raw", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    from _common import build_model

    model = args.work_dir / "llama-100m"
    build_model(model)
    raw_path = args.work_dir / "gather_units.json"
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", __file__, "--worker",
            "--model", str(model), "--raw", str(raw_path), "--repeats", str(args.repeats), "--calls", str(args.calls)]
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise CommandFailed(f"the ranks exited {done.returncode}:\n{(done.stdout + done.stderr)[-4000:]}")
    report(json.loads(raw_path.read_text()), args.out)


if __name__ == "__main__":
    main()
