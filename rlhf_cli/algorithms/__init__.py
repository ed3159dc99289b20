"""The algorithms rlhf runs, one entry each; every other layer reads them from here.

Adding an algorithm: a module here with its `ALGORITHM` entry, listed below; its builder in the ranks (TRL's
generating trainers share `rlhf_cli.rank.builders:build_trl_generating`, given `trainer_class`); its
schema snapshot (`python -m rlhf_cli.schema.snapshot`); `recipes/NAME/smoke.yaml`. The registry test checks
that each entry has all of these.
"""

from __future__ import annotations

from rlhf_cli.algorithms import grpo, online_dpo, ppo, rloo
from rlhf_cli.algorithms.spec import Algorithm

ALGORITHMS: dict[str, Algorithm] = {entry.name: entry for entry in (
    ppo.ALGORITHM,
    rloo.ALGORITHM,
    online_dpo.ALGORITHM,
    grpo.ALGORITHM,
)}


def algorithm(name: str) -> Algorithm:
    """The entry for a resolved run's algorithm (`online_dpo`) or a command (`online-dpo`)."""
    return ALGORITHMS[name.replace("-", "_")]
