"""How the policy generates: one typed value, built once by config and read by plan, launch, the CLI and ranks.

In a recipe it is two of TRL's keys, `ds3_gather_for_generation` (`gather`: true, false or auto) and rlhf's
`gather_budget`; resolution settles them into agreeing values (rlhf_cli/config/run_checks.py), and this module
reads them once into a `Generation`. The resolved recipe still writes the two keys (`trl_settings`), so the ranks
and TRL read what they always did; the ranks build their `Generation` from it the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from rlhf_cli.gather_budget import Budget, parse_budget

GATHER_KEY = "ds3_gather_for_generation"
BUDGET_KEY = "gather_budget"


@dataclass(frozen=True)
class Gather:
    """What each rank gathers of a ZeRO-3 policy for one generation call.

    `Gather.whole` (TRL's gather), `Gather.shards` (TRL's no-gather: every module fetched per token),
    `Gather.of(budget)` (the budget's units once per call, the rest from shards) or `Gather.auto` (the plan
    chooses one of the others before launch; the ranks never see it).
    """

    mode: str  # "whole", "budget", "shards" or "auto"
    budget: Budget | None = None  # set exactly for "budget"

    whole: ClassVar[Gather]
    shards: ClassVar[Gather]
    auto: ClassVar[Gather]

    @staticmethod
    def of(budget: Budget) -> Gather:
        """A budget; the whole policy's is `whole` and none is `shards`, as `--gather` and `--no-gather` are."""
        return Gather.whole if budget.whole else Gather.shards if budget.nothing else Gather("budget", budget)

    @property
    def through_shards(self) -> bool:
        """TRL generates without gathering (`ds3_gather_for_generation: false`); a budget gathers its part."""
        return self.mode in ("shards", "budget")

    @property
    def trl_gather(self) -> bool | str:
        """The value of TRL's `ds3_gather_for_generation`: true, false, or `auto` before the plan settles it."""
        return "auto" if self.mode == "auto" else self.mode == "whole"

    def __str__(self) -> str:
        return f"budget {self.budget}" if self.budget is not None else self.mode


Gather.whole = Gather("whole")
Gather.shards = Gather("shards")
Gather.auto = Gather("auto")


@dataclass(frozen=True)
class Generation:
    """The generation choice of a run. Only Hugging Face generation (`model.generate` inside the trainer) today;
    another engine (vLLM, with its mode) goes here as an `engine` field next to `gather`, written to its own TRL
    keys by `trl_settings`, so that plan, launch and ranks keep reading this one value."""

    gather: Gather = Gather.whole

    @classmethod
    def from_values(cls, value: Callable[[str], Any]) -> Generation:
        """From the settled keys, `value(name)` giving each (its default when unset); resolution checked them."""
        gather, budget = value(GATHER_KEY), value(BUDGET_KEY)
        if gather == "auto":
            return cls(Gather.auto)
        if gather is not False:
            return cls(Gather.whole)
        return cls(Gather.shards if budget is None else Gather.of(parse_budget(budget)))

    def trl_settings(self) -> dict[str, Any]:
        """The recipe keys that say it: TRL's `ds3_gather_for_generation`, and `gather_budget` for a budget."""
        settings: dict[str, Any] = {GATHER_KEY: self.gather.trl_gather}
        if self.gather.budget is not None:
            budget = self.gather.budget
            settings[BUDGET_KEY] = budget.fraction if budget.fraction is not None else f"{budget.size}B"
        return settings

    def describe(self) -> str:
        """One line for the run's header."""
        if self.gather.mode == "whole":
            return "gather to generate"
        if self.gather.mode == "budget":
            return f"gather {self.gather.budget} of the policy to generate, the rest from shards"
        return "generate from shards" if self.gather.mode == "shards" else "gather or not, as the plan chooses"
