"""GRPO's tool-calling turns taken by every rank together, so that ranks whose rollouts take different numbers of
turns do not deadlock.

TRL 1.16's tool loop (`GRPOTrainer._tool_call_loop`) runs per rank: each turn runs this rank's tools, drops the
rollouts whose tool results would pass `max_completion_length`, and regenerates the rest. That regeneration is a
collective wherever generation is one (ZeRO-3 gathers or fetches shards for every forward; vLLM's server mode
gathers prompts; tensor-parallel vLLM gathers in its group). A rank whose rollouts stop calling tools, go overlong
or reach the turn limit sooner leaves the loop and enters the next collective (`accelerator.gather`) while another
waits in generation: a deadlock, or two collectives that do not match.

Here every regeneration inside the loop is preceded by an all-reduce of "this rank regenerates" (1), and a rank
that has left the loop keeps answering 0 and, while any rank still regenerates, regenerates one throwaway row
(its first prompt) alongside it. Every rank thus takes part in every regeneration, and all leave together once
no rank has rollouts to continue. The turn limit and the overlong rule stay TRL's, counted per rank. Drop this
module once TRL's loop takes its turns collectively.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlhf_cli import compat


class CollectiveTurns:
    """The trainer's tool loop and single-turn generation, wrapped as above (install with `take_turns_together`)."""

    def __init__(self, loop: Callable[..., Any], single_turn: Callable[..., Any],
                 any_rank: Callable[[bool], bool]) -> None:
        self.loop = loop
        self.single_turn = single_turn
        self.any_rank = any_rank  # all-reduce: whether any rank said True
        self.in_loop = False
        self.turns = 0  # regenerations this rank took part in during the last loop, throwaway rows included
        self.throwaway_turns = 0

    def tool_call_loop(self, prompts: list, prompt_ids: list, *args: Any, **kwargs: Any) -> Any:
        self.in_loop, self.turns, self.throwaway_turns = True, 0, 0
        try:
            result = self.loop(prompts, prompt_ids, *args, **kwargs)
        finally:
            self.in_loop = False
        while self.any_rank(False):  # another rank regenerates: take part with one throwaway row
            self.turns += 1
            self.throwaway_turns += 1
            self.single_turn([list(prompt_ids[0])], None, {}, 1)
        return result

    def generate_single_turn(self, prompt_ids: list, *args: Any, **kwargs: Any) -> Any:
        if self.in_loop:
            self.any_rank(True)  # tell the ranks that left the loop to join this regeneration
            self.turns += 1
        return self.single_turn(prompt_ids, *args, **kwargs)


def any_rank_says(device: Any) -> Callable[[bool], bool]:
    """An all-reduce over the default process group: whether any rank passed True."""
    import torch
    import torch.distributed as dist

    def any_rank(says: bool) -> bool:
        flag = torch.tensor([1 if says else 0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    return any_rank


def take_turns_together(trainer: Any) -> CollectiveTurns | None:
    """Make a multi-rank GRPO trainer with tools take its tool-calling turns together; None when there is nothing
    to do (one process, no tools)."""
    import torch.distributed as dist

    if not getattr(trainer, "tools", None) or not dist.is_initialized() or dist.get_world_size() < 2:
        return None
    loop, single_turn = compat.trl_tool_turns(trainer)
    turns = CollectiveTurns(loop, single_turn, any_rank_says(trainer.accelerator.device))
    compat.replace_trl_tool_turns(trainer, turns.tool_call_loop, turns.generate_single_turn)
    return turns
