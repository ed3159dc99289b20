"""When the weight sync checks itself and how large its probe is: the ranks run the check
(rlhf_cli/rank/engines/vllm/self_check.py), the plan times it (rlhf_cli/plan/engines/vllm_time.py). No torch."""

from __future__ import annotations

PROBE_PROMPTS = 3
PROBE_PROMPT_TOKENS = 6
PROBE_TOKENS = 4
FIRST_CHECKED = 2  # syncs checked from the start: the starting weights', then the first update's


def checked(sync: int, every: int, woke: bool) -> bool:
    """Whether sync number `sync` (from 1) is checked: the first two, the one after a wake from sleep, every
    `every`-th (0: never). TRL's trainers sync the starting weights before the first generation, which vLLM already
    holds: a sync that drops a parameter passes that check, so the second (the first update's weights) is checked
    too; a short run would otherwise end before the `every`-th."""
    return every > 0 and (sync <= FIRST_CHECKED or woke or sync % every == 0)
