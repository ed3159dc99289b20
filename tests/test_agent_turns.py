"""GRPO's tool-calling turns across ranks (rlhf_cli/rank/agent_turns.py): two processes over gloo run TRL 1.16's own
`_tool_call_loop` on a trainer whose generation is a collective, as under ZeRO-3, and whose tool makes rank 0's
rollouts call again every turn while rank 1's stop after one (or go overlong before any regeneration)."""

from __future__ import annotations

import multiprocessing
import os
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

from helpers import free_port

CALL, ANSWER = 1, 2  # the fake policy's tokens: a tool call, a final answer
AGAIN, DONE = 100, 101  # the tool-result suffix's token: the tool said "call again", or gave its result
TURN_LIMIT = 3
COLLECTIVE_TIMEOUT = timedelta(seconds=20)


def lookup(expression: str) -> str:
    """Look something up; rank 0's lookups say to call again, rank 1's answer.

    Args:
        expression: What to look up.
    """
    if os.environ["SCENARIO"] == "overlong" and os.environ["RANK"] == "1":
        return "x" * 1000
    return "again" if os.environ["RANK"] == "0" else "42"


class CollectiveGenerationTrainer:
    """What TRL's `_tool_call_loop` reads of a GRPOTrainer, with a generation that is one collective per call
    (ZeRO-3 under gather: the parameters gathered once; from shards there would be one per token)."""

    def __init__(self, rows: int, max_completion_length: int) -> None:
        from trl.trainer.grpo_trainer import GRPOTrainer

        self._tool_call_loop = GRPOTrainer._tool_call_loop.__get__(self)
        self.tools = [lookup]
        self.max_tool_calling_iterations = TURN_LIMIT
        self.max_completion_length = max_completion_length
        self._sync_tool_dicts = [{"lookup": lookup} for _ in range(rows)]
        self._async_tool_dicts = [{} for _ in range(rows)]
        self.use_vllm, self._is_vlm, self.environment_factories, self._tokenizer = False, False, None, None
        self.model = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=4096))
        self.accelerator = SimpleNamespace(device="cpu")
        self.generated: list[int] = []  # rows generated per call

    def _get_tool_suffix_ids(self, tool_messages: list[dict]) -> list[int]:
        content = tool_messages[-1]["content"]
        return [AGAIN] if content == "again" else [DONE] * (len(content) // 10 + 1)

    def _generate_single_turn(self, prompt_ids: list[list[int]], images: Any, multimodal_fields: Any,
                              num_generations: int, has_tool_images: bool = False) -> tuple[list, None]:
        import torch
        import torch.distributed as dist

        dist.all_reduce(torch.ones(1))  # every rank must be in here at once
        self.generated.append(len(prompt_ids))
        return [[CALL] if row[-1] == AGAIN else [ANSWER] for row in prompt_ids], None


def parse(tokenizer: Any, ids: list[int], prefix: Any = None, tools: Any = None) -> dict:
    """TRL's `parse_response` for the fake policy's tokens."""
    if ids[0] == CALL:
        call = {"type": "function", "function": {"name": "lookup", "arguments": {"expression": "x"}}}
        return {"role": "assistant", "content": "", "tool_calls": [call]}
    return {"role": "assistant", "content": "42"}


def one_rank(rank: int, port: int, scenario: str, together: bool, results: Any) -> None:
    os.environ.update(RANK=str(rank), SCENARIO=scenario)
    import torch
    import torch.distributed as dist

    from rlhf_cli import compat

    compat.keep_trl_from_importing_vllm()  # as a rank without vLLM does: seconds of import saved in each process
    import trl.trainer.grpo_trainer as grpo

    from rlhf_cli.rank.agent_turns import take_turns_together

    grpo.parse_response = parse
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=COLLECTIVE_TIMEOUT)
    try:
        rows = 2
        trainer = CollectiveGenerationTrainer(rows, max_completion_length=64)
        turns = take_turns_together(trainer) if together else None
        prompts = [[{"role": "user", "content": "look it up"}] for _ in range(rows)]
        prompt_ids = [[7, 8] for _ in range(rows)]
        first = parse(None, [CALL])
        completions = [[dict(first)] for _ in range(rows)]
        output = trainer._tool_call_loop(prompts, prompt_ids, [[CALL] for _ in range(rows)], completions, None,
                                         None, {})
        lengths = torch.tensor([len(ids) for ids in output[2]])
        gathered = [torch.zeros_like(lengths) for _ in range(2)]
        dist.all_gather(gathered, lengths)  # what TRL's _generate does next (accelerator.gather)
        results.put((rank, "finished", trainer.generated, output[4], turns and turns.throwaway_turns))
    except Exception as error:  # noqa: BLE001 - the deadlock or mismatch the test expects without the fix
        results.put((rank, "failed", type(error).__name__, None, None))
    finally:
        dist.destroy_process_group()


def run_ranks(scenario: str, together: bool) -> dict[int, tuple]:
    port = free_port()
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    ranks = [context.Process(target=one_rank, args=(rank, port, scenario, together, results)) for rank in (0, 1)]
    for process in ranks:
        process.start()
    timeout = COLLECTIVE_TIMEOUT.total_seconds() * 3 + 60
    found = {}
    for process in ranks:
        process.join(timeout)
        if process.is_alive():
            process.kill()
    while not results.empty():
        rank, *rest = results.get()
        found[rank] = tuple(rest)
    return found


def test_a_rank_whose_rollouts_stop_calling_joins_every_regeneration_of_the_rank_that_goes_on() -> None:
    """Rank 0 regenerates its 2 rollouts at each of the 3 turns TRL allows; rank 1 stops after its first
    regeneration and joins rank 0's other two with one throwaway row each. Both then reach the gather after the
    loop; each counts only its own tool calls (2 rollouts x 3 turns, 2 x 1)."""
    found = run_ranks("calls", together=True)
    assert found[0] == ("finished", [2, 2, 2], 6, 0)
    assert found[1] == ("finished", [2, 1, 1], 2, 2)


def test_a_rank_whose_tool_results_all_go_overlong_joins_without_regenerating_its_own() -> None:
    """Rank 1's tool results pass max_completion_length, so TRL's loop breaks before it regenerates anything (its
    results rolled back); rank 0 regenerates 3 times, and rank 1 joins each with a throwaway row."""
    found = run_ranks("overlong", together=True)
    assert found[0] == ("finished", [2, 2, 2], 6, 0)
    assert found[1] == ("finished", [1, 1, 1], 2, 3)


def test_without_collective_turns_the_ranks_meet_in_different_collectives() -> None:
    """The case above on TRL's loop as it is: rank 1 reaches the gather while rank 0 waits in its next
    regeneration, and neither finishes (gloo's mismatch or the collective timeout)."""
    found = run_ranks("calls", together=False)
    assert not all(found.get(rank, ("lost",))[0] == "finished" for rank in (0, 1)), found
