"""The plan's rows for each generation engine: `vllm` (vLLM's share of a GPU and its weight sync), `vllm_search`
(the first colocated vLLM configuration that fits), `vllm_time` (its generation and sync seconds), and `vllm_plan`,
what the plan asks of it.

Each separate engine's registry row names its plan module (its `plan` face). Such a module offers
`engine_rows(inputs, candidate, rows)` (its rows of every column, 0 where another engine generates),
`engine_starts(inputs, candidate)`, `engine_batch(inputs, candidate)`, `engine_seconds(inputs, candidate, rates,
step)` (generation and weight-sync seconds of a step), `run_settings(value)` (a candidate's `engine_settings`),
`left_open(run)` (whether `gather: auto` may choose it), `engine_findings(evaluate, inputs, settings, engine,
own_offload)` and `WORDS` (how the plan names it when it settles the gather choice). Its types are the plan's
(Inputs, Candidate, Component), which import this package: named `Any` here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from rlhf_cli.generation.choice import Engine
from rlhf_cli.generation.engines import EngineSpec, face_paths

# The plan's JSON keys for a separate engine (rlhf_cli/plan/__init__.py): a configuration's engine settings and
# the plan's findings on the engine; named when vLLM was the only one
SETTINGS_KEY, FINDINGS_KEY = "vllm", "vllm_findings"


@dataclass(frozen=True)
class EngineWords:
    """How `gather: auto`'s settlement names a separate engine (rlhf_cli/plan/estimate.py settle_gather)."""

    syncing_whole: str  # what gathering the whole policy does with it
    no_plan: str  # the note when no plan settles its sync ({why}: the reason there is none)
    left_open: str  # the engine, chosen where the run left the engine open
    chosen: str  # the prefix of the chosen sync in the note
    defaulted: str  # how the source says no gather choice was given with it


def plan_room(spec: EngineSpec) -> ModuleType:
    """The plan's code for a separate engine (its registry row's `plan` face), imported now."""
    return importlib.import_module(spec.faces["plan"])


def _rooms() -> list[ModuleType]:
    return [importlib.import_module(path) for path in face_paths("plan")]


def engine_rows(inputs: Any, candidate: Any, rows: list[Any]) -> list[Any]:
    """Every separate engine's rows of a column whose other `rows` are counted (0 where it does not generate)."""
    return [row for room in _rooms() for row in room.engine_rows(inputs, candidate, rows)]


def engine_starts(inputs: Any, candidate: Any) -> bool:
    """False where the candidate's separate engine cannot start, whatever else fits."""
    return candidate.engine_settings is None or plan_room(candidate.generation.engine.spec).engine_starts(inputs,
                                                                                                        candidate)


def engine_settings(value: Callable[[str], Any], engine: Engine) -> Any:
    """The run's settings of `engine` when it is a separate one (a candidate's `engine_settings`), else None."""
    return plan_room(engine.spec).run_settings(value) if engine.separate else None
