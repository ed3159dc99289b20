"""The memory plan's time against a model's depth: `rlhf plan` (and every dry run and launch, which plan) must
take about as long for 100,000 decoder layers as for 2. In-process, the smoke policy's config.json with
num_hidden_layers set, planned for full fine-tuning and for LoRA; best of `--repeats`.

    python benchmarks/plan_depth.py [--repeats 3] [--layers 2 1000 20000 100000]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from _common import RECIPES, REPO, WORK, print_table

sys.path.insert(0, str(REPO))


def plan_seconds(model: Path, lora: bool, repeats: int) -> float:
    from rlhf_cli.config.resolve import RunRequest, resolve
    from rlhf_cli.plan.estimate import plan_run

    flags = {"model_name_or_path": ("--model", str(model)), **({"use_peft": ("--lora", True)} if lora else {})}
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        plan_run(resolve(RunRequest("rloo", str(RECIPES / "rloo" / "smoke.yaml"), flags=flags, planning=True),
                         cwd=WORK, cuda=False))
        best = min(best, time.perf_counter() - started)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 1000, 20000, 100000])
    args = parser.parse_args()
    rows = []
    for layers in args.layers:
        model = WORK / f"plan-depth-{layers}"
        shutil.rmtree(model, ignore_errors=True)
        model.mkdir(parents=True)
        config = json.loads((RECIPES / "smoke" / "policy" / "config.json").read_text())
        (model / "config.json").write_text(json.dumps({**config, "num_hidden_layers": layers}))
        rows.append([f"{layers:,}", f"{plan_seconds(model, False, args.repeats):.3f}",
                     f"{plan_seconds(model, True, args.repeats):.3f}"])
    print_table("rlhf plan: resolve + plan seconds by depth (best of repeats)",
                ["num_hidden_layers", "full fine-tuning s", "LoRA s"], rows)


if __name__ == "__main__":
    main()
