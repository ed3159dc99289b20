"""How the policy generates: one typed value, built once by config and read by plan, launch, the CLI and ranks.

In a recipe it is TRL's keys, `ds3_gather_for_generation` (`gather`: true, false or auto), `use_vllm` and
`vllm_mode` (the engine), and rlhf's `gather_budget`; resolution settles them into agreeing values
(rlhf_cli/config/run_checks.py), and this module reads them once into a `Generation`. The resolved recipe still
writes those keys (`trl_settings`), so the ranks and TRL read what they always did; the ranks build their
`Generation` from it the same way. With vLLM the gather choice governs its weight sync
(rlhf_cli/rank/engines/weights.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from rlhf_cli.generation.budget import Budget, parse_budget
from rlhf_cli.generation.engines import ENGINES, HF, EngineSpec, engine_of, separate_engine, separate_engine_of

GATHER_KEY = "ds3_gather_for_generation"
BUDGET_KEY = "gather_budget"


@dataclass
class GatherSettings:
    """TRL's gather key (GATHER_KEY) as a field, with TRL's default, for a config of rlhf's own to inherit as TRL's
    configs hold it (PPO's, rlhf_cli/rank/ppo/config.py)."""

    ds3_gather_for_generation: bool = field(
        default=True, metadata={"help": "Under ZeRO-3, gather the whole policy on every rank to generate."})


@dataclass(frozen=True)
class Engine:
    """What samples the rollouts: Hugging Face's `generate` inside the trainer (`Engine.hf`), or vLLM colocated in
    every training process (`Engine.colocate`) or on a server of its own (`Engine.server`). What each one asks of
    the layers is its row in the engine registry (`spec`, rlhf_cli/generation/engines.py)."""

    name: str  # a registry row's name: "hf" or "vllm"
    mode: str | None = None  # its mode: "colocate" or "server" for vLLM

    hf: ClassVar[Engine]
    colocate: ClassVar[Engine]
    server: ClassVar[Engine]

    @staticmethod
    def from_values(value: Callable[[str], Any]) -> Engine:
        """From the run's TRL keys, as the registry reads them (`engine_of`); a mistyped mode is a choice field's
        error, found by resolution."""
        return Engine(*engine_of(value).key)

    @staticmethod
    def separate_of(value: Callable[[str], Any]) -> Engine:
        """The separate engine the run's keys name, whether or not it generates with it (the plan's columns)."""
        return Engine(*separate_engine_of(value).key)

    @property
    def spec(self) -> EngineSpec:
        return ENGINES[self.name, self.mode]

    @property
    def separate(self) -> bool:
        """An engine beside the trainer, whose copy of the policy's weights is synced (EngineSpec.is_separate)."""
        return self.spec.is_separate

    def trl_settings(self) -> dict[str, Any]:
        """TRL's keys that choose it; none for `generate`, TRL's default (`use_vllm: false`)."""
        return dict(self.spec.trl_keys)

    def __str__(self) -> str:
        return self.spec.label


Engine.hf = Engine(*HF.key)
Engine.colocate = Engine(*separate_engine("colocate").key)
Engine.server = Engine(*separate_engine("server").key)


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
    """The generation choice of a run: the engine that samples, and how much of a ZeRO-3 policy is gathered at
    once, to generate (`generate`) or to refresh vLLM's copy of the weights (vLLM). Plan, launch, the CLI and
    the ranks read this one value; `trl_settings` writes it back as TRL's keys."""

    gather: Gather = Gather.whole
    engine: Engine = Engine.hf

    @classmethod
    def from_values(cls, value: Callable[[str], Any]) -> Generation:
        """From the settled keys, `value(name)` giving each (None or its default when unset); resolution checked
        them."""
        gather, budget, engine = value(GATHER_KEY), value(BUDGET_KEY), Engine.from_values(value)
        if gather == "auto":
            return cls(Gather.auto, engine)
        if gather is not False:
            return cls(Gather.whole, engine)
        return cls(Gather.shards if budget is None else Gather.of(parse_budget(budget)), engine)

    def trl_settings(self) -> dict[str, Any]:
        """The recipe keys that say it: TRL's `ds3_gather_for_generation`, `gather_budget` for a budget, and
        TRL's `use_vllm` and `vllm_mode` for vLLM."""
        settings: dict[str, Any] = {GATHER_KEY: self.gather.trl_gather, **self.engine.trl_settings()}
        if self.gather.budget is not None:
            budget = self.gather.budget
            settings[BUDGET_KEY] = budget.fraction if budget.fraction is not None else f"{budget.size}B"
        return settings

    def describe(self) -> str:
        """One line for the run's header."""
        if self.engine.separate:
            sync = {"whole": "the whole policy at once", "budget": f"{self.gather.budget} of the policy at once",
                    "shards": "one unit at a time", "auto": "as much at once as the plan chooses"}[self.gather.mode]
            return f"generate with {self.engine}, its weights synced {sync}"
        if self.gather.mode == "whole":
            return "gather to generate"
        if self.gather.mode == "budget":
            return f"gather {self.gather.budget} of the policy to generate, the rest from shards"
        return "generate from shards" if self.gather.mode == "shards" else "gather or not, as the plan chooses"
