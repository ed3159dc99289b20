"""The few logged metrics worth a glance per algorithm, shared by the progress line and the summary."""

from __future__ import annotations

from typing import Any

# Per algorithm: (logged metric, label shown), in display order; metrics a run did not log are left out.
HEADLINE_METRICS = {
    "rloo": (("reward", "reward"), ("kl", "kl"), ("loss", "loss"), ("step_time", "s/step")),
    "online_dpo": (("objective/scores", "score"), ("objective/kl", "kl"), ("loss", "loss")),
    "ppo": (("objective/scores", "score"), ("objective/kl", "kl"), ("loss/policy_avg", "loss"),
            ("loss/value_avg", "value loss")),
}


def headline(algorithm: str, logs: dict[str, Any]) -> list[tuple[str, float]]:
    """(label, value) for each headline metric present in one log entry."""
    return [(label, logs[key]) for key, label in HEADLINE_METRICS[algorithm]
            if isinstance(logs.get(key), (int, float))]


def format_metrics(algorithm: str, logs: dict[str, Any]) -> str:
    """`reward 0.412  kl 0.0031  loss -0.05`: the headline numbers of one log entry."""
    return "  ".join(f"{label} {value:.4g}" for label, value in headline(algorithm, logs))
