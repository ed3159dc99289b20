"""The longest prompts of a data file, found one way for every check that needs them.

A prompt is text, or a conversation whose messages' contents are its text (`prompt_text`); `longest_prompt_rows` ranks
rows by a measure of that text the caller names: characters (`len`, the rehearsal, which keeps the worst rows
without a tokenizer) or the policy's tokens (the vLLM model-length check, rlhf_cli/config/engines/vllm.py).
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Callable, Iterable
from typing import Any

Row = dict[str, Any]


def prompt_text(prompt: Any) -> str:
    """A prompt's text: itself, or a conversation's messages' contents together (anything else as JSON)."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        return "".join(prompt_text(message.get("content", "")) if isinstance(message, dict) else prompt_text(message)
                       for message in prompt)
    return json.dumps(prompt, default=str)


def longest_prompt_rows(rows: Iterable[tuple[int, Row]], column: str, count: int,
                    measure: Callable[[str], int]) -> tuple[list[tuple[int, int, Row]], int]:
    """The `count` (line, row) pairs of `rows` whose prompt in `column` measures longest, longest first (the earlier
    row first among equals), each as (its measure, its line, the row); with the rows read. A row without the
    column has an empty prompt."""
    read = 0
    longest: list[tuple[int, int, Row]] = []
    for line, row in rows:
        read += 1
        entry = (measure(prompt_text(row.get(column, ""))), -line, row)
        (heapq.heappush if len(longest) < count else heapq.heappushpop)(longest, entry)
    ranked = sorted(longest, reverse=True, key=lambda entry: entry[:2])
    return [(length, -negative_line, row) for length, negative_line, row in ranked], read
