"""The agent smoke recipe's tool and reward (recipes/grpo/agent-smoke.yaml); the stand-in policy in ./agent was
taught by build.py to call `calculate` for "What is 3 + 4?" and to answer with the tool's result."""

from __future__ import annotations

import re

_EXPRESSION = re.compile(r"\s*(-?\d+)\s*([+\-*/])\s*(-?\d+)\s*")


def calculate(expression: str) -> str:
    """Work out one arithmetic operation on two whole numbers.

    Args:
        expression: Two whole numbers joined by +, -, * or /, such as "3 + 4".
    """
    match = _EXPRESSION.fullmatch(expression)
    if match is None:
        raise ValueError(f"not two whole numbers joined by +, -, * or /: {expression!r}")
    left, operator, right = int(match[1]), match[2], int(match[3])
    if operator == "/":
        return str(left / right)  # ZeroDivisionError for "/ 0": the trainer counts it as a failed call
    return str({"+": left + right, "-": left - right, "*": left * right}[operator])


def _final_answer(completion: list[dict]) -> str:
    """The last assistant turn's text: what the policy said after the tool results."""
    said = [message.get("content") or "" for message in completion if message.get("role") == "assistant"]
    return said[-1].strip() if said else ""


def answer_reward(completions: list[list[dict]], **kwargs) -> list[float]:
    """1 for a final answer that is the right number (the dataset's `answer` column, passed by the trainer), else 0."""
    return [float(_final_answer(completion) == expected) for completion, expected in zip(completions, kwargs["answer"])]
