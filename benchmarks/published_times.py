"""`rlhf plan`'s seconds against step and sync times others published: every published ordering (which of two
configurations is faster) and the error of each time.

Each row is replayed as `plan_published.py` replays memory (the model's config.json from tests/fixtures/models,
the trainer's fields as a recipe) with the GPU named; its prediction is the run's own configuration's
`step_seconds`, or for a weight sync the plan's sync model (rlhf_cli/plan/vllm_time.py) on the published
model's tensors. What a source does not state is assumed, and the table says what. Sources this table cannot
replay faithfully are listed under it with the reason.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from plan_published import GKD, GKD_JSD, MS_SWIFT, Published, plan_of

from rlhf_cli.machine.gpus import GPUS
from rlhf_cli.plan.rates import Rates
from rlhf_cli.plan.vllm_time import buckets_seconds

SWIFT_GKD = f"ms-swift [GKD examples]({MS_SWIFT}/rlhf/gkd)"
MEGATRON_BRIDGE = "Megatron-LM bridge (the issue's figures: Qwen3-30B-A3B weight sync)"


@dataclass(frozen=True)
class PublishedTime:
    source: str
    setup: str
    seconds: float  # as published: per optimizer step, or per weight sync
    unit: str  # "s/step" or "s/sync"
    assumed: str  # what the source does not state and the replay assumes
    predict: Callable[[Path], float]  # a scratch path for the recipe -> predicted seconds


def _gkd(engine: dict[str, object]) -> Callable[[Path], float]:
    """ms-swift's GKD Qwen2.5-7B on 4 GPUs as in plan_published.py, the 14B teacher scoring every completion."""
    recipe = {**GKD, "reward_model_name_or_path": "Qwen/Qwen2.5-14B-Instruct", "gpu": "a100-80gb", **engine}

    def predict(path: Path) -> float:
        row = Published(SWIFT_GKD, "", "rloo", recipe, 4, "81920MiB", True, head=GKD_JSD)
        chosen = plan_of(row, path).chosen
        assert chosen is not None and chosen.step_seconds is not None
        return chosen.step_seconds
    return predict


# Qwen3-30B-A3B (its config.json): 30.5B parameters in bf16; 48 layers of 128 experts x 3 matrices, 4 attention
# projections, 2 per-head norms, 2 layer norms and a router, plus embedding, final norm and LM head
QWEN3_30B_A3B_BYTES = 30.5e9 * 2
QWEN3_30B_A3B_TENSORS = 48 * (128 * 3 + 9) + 3


def _megatron_sync(bucket_bytes: float | None) -> Callable[[Path], float]:
    """The sync of every tensor one at a time (`None`) or packed into buckets of `bucket_bytes`, colocated on 8
    H100s (assumed)."""
    def predict(_: Path) -> float:
        rates = Rates.of(GPUS["h100"], 8, 1, False)
        tensor = QWEN3_30B_A3B_BYTES / QWEN3_30B_A3B_TENSORS
        if bucket_bytes is None:
            buckets = [(tensor, 1, QWEN3_30B_A3B_TENSORS)]
        else:
            count = math.ceil(QWEN3_30B_A3B_BYTES / bucket_bytes)
            buckets = [(QWEN3_30B_A3B_BYTES / count, QWEN3_30B_A3B_TENSORS // count, count)]
        return buckets_seconds(buckets, rates, server=False)
    return predict


GKD_ASSUMED = ("A100 80GB with NVLink; the teacher counted as a ZeRO-3 reward model on the training GPUs; "
               "alpaca prompts 512 tokens")
ROWS = [
    PublishedTime(SWIFT_GKD, "GKD Qwen2.5-7B, 14B teacher, 4 GPUs, batch 4, response 512: HF generation", 46,
                  "s/step", GKD_ASSUMED, _gkd({"use_vllm": False, "gather": True})),
    PublishedTime(SWIFT_GKD, "the same, vLLM colocated at 0.3, sleeping", 11, "s/step", GKD_ASSUMED,
                  _gkd({"vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.3,
                        "vllm_enable_sleep_mode": True})),
    PublishedTime(SWIFT_GKD, "the same, a vLLM server", 5, "s/step", f"{GKD_ASSUMED}; the server on 1 GPU",
                  _gkd({"vllm_mode": "server"})),
    PublishedTime(MEGATRON_BRIDGE, "Qwen3-30B-A3B weight sync, tensor by tensor", 84.9, "s/sync",
                  "8 x H100 NVLink, colocated; tensors counted from the architecture", _megatron_sync(None)),
    PublishedTime(MEGATRON_BRIDGE, "the same in 2 GiB buckets", 11.8, "s/sync", "as above",
                  _megatron_sync(2 * 2**30)),
]
# (faster, slower) by row index: what each source published as the faster of two configurations
ORDERINGS = [(1, 0), (2, 1), (2, 0), (4, 3)]
NOT_REPLAYED = [
    ("ms-swift DPO Qwen2.5-7B, padding-free 1.90 s/it against padded 3.32 s/it",
     "the plan has no DPO trainer and no padding-free mode: none of the generating trainers has one in TRL 1.16"),
    ("TRL v1.11 server-mode GRPO, 1.08 -> 0.63 s/step on H100",
     "a change inside TRL between versions, one configuration: nothing the plan chooses"),
    ("Hugging Face's async-GRPO write-up, 1.5B LoRA runs on H200",
     "its configurations and times are not stated in the issue that cites it; not replayed from memory"),
]


def replay(scratch: Path) -> tuple[list[str], list[list[str]], list[str]]:
    """The table's columns and rows, and one line per published ordering."""
    predicted = [row.predict(scratch / f"time-{index}.yaml") for index, row in enumerate(ROWS)]
    columns = ["source", "configuration", "published", "predicted", "error", "assumed"]
    rows = [[row.source, row.setup, f"{row.seconds:g} {row.unit}", f"{seconds:.3g} {row.unit}",
             f"{(seconds - row.seconds) / row.seconds:+.0%}", row.assumed]
            for row, seconds in zip(ROWS, predicted, strict=True)]
    orderings = []
    for faster, slower in ORDERINGS:
        right = predicted[faster] < predicted[slower]
        orderings.append(f"{'right' if right else 'WRONG'}: {ROWS[faster].setup} faster than {ROWS[slower].setup} "
                         f"(published {ROWS[faster].seconds:g} against {ROWS[slower].seconds:g}, predicted "
                         f"{predicted[faster]:.3g} against {predicted[slower]:.3g})")
    return columns, rows, orderings
