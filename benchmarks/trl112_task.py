"""The hand-set learnable reward of benchmarks/ppo_vs_trl112.py, one function for both trainers.

A response scores the share of its `RESPONSE_LENGTH` slots holding a token whose text contains the letter "e" (many
tokens of the smoke tokenizer do, most do not): a tiny random policy can learn it in a few dozen updates. Each call
appends its time to $BENCH_REWARD_LOG, once per update here (one scoring chunk), so that seconds per update are
measured the same way for both trainers.
"""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path

POLICY = Path(__file__).resolve().parent.parent / "recipes" / "smoke" / "policy"
RESPONSE_LENGTH = 12
LOG_ENV = "BENCH_REWARD_LOG"


@functools.cache
def target_ids() -> frozenset[int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(POLICY)
    return frozenset(i for token, i in tokenizer.get_vocab().items() if "e" in token and i not in
                     tokenizer.all_special_ids)


def score(response_ids: list[int]) -> float:
    return sum(token in target_ids() for token in response_ids) / RESPONSE_LENGTH


def note_call() -> None:
    if os.environ.get(LOG_ENV):
        with open(os.environ[LOG_ENV], "a") as log:
            log.write(f"{time.time()}\n")


def hand_set_reward(completion_ids: list[list[int]], **_: object) -> list[float]:
    """rlhf's reward function: each completion's own tokens."""
    note_call()
    return [score(ids) for ids in completion_ids]
