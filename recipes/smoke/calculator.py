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


def _closeness(said: str, expected: str) -> float:
    """1 for the right number, less the further off it is, 0 for no number."""
    try:
        return 1 / (1 + abs(float(said) - float(expected)))
    except ValueError:
        return 0.0


def answer_reward(completions: list[list[dict]], **kwargs) -> list[float]:
    """How close the final answer is to the dataset's `answer` column (which the trainer passes): 1 when right."""
    return [_closeness(_final_answer(completion), expected)
            for completion, expected in zip(completions, kwargs["answer"])]
