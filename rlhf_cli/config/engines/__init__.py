"""A run's settings for each generation engine, read and checked before anything starts: `vllm` (TRL's `vllm_*`
keys, the installed version, lengths, the server a run's ranks will talk to) with `vllm_server` (reaching it); and
the keys of rlhf's own an engine adds to every recipe (`ENGINE_FIELDS`, in the catalogue of
rlhf_cli/config/fields.py).

Each separate engine's row in the registry names its module here (its `config` face). Such a module offers
`engine_problems(values, said, processes, cuda, planning)`, `length_problems(values, completion_field,
prompt_file, column)`, `tied_head_problems(values, targets)` and `check_server(draft)`, each with nothing to say of
a run that generates with another engine, and `SYNC_DEFAULT_SOURCE`, the source of the gather choice it defaults.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

from rlhf_cli.algorithms.spec import Values
from rlhf_cli.config.field_types import Field
from rlhf_cli.generation.engines import SYNC_CHECK_KEY, EngineSpec, face_paths

ENGINE_FIELDS = (
    Field(SYNC_CHECK_KEY, "launch", ("int",), 10,
          "With vLLM colocated: compare vLLM's logprobs with the policy's on a fixed probe after the first weight "
          "sync, after every wake from sleep and every this many syncs; the run stops when they differ. 0: never."),
)


def config_room(spec: EngineSpec) -> ModuleType:
    """The config layer's code for a separate engine (its registry row's `config` face), imported now."""
    return importlib.import_module(spec.faces["config"])


def _rooms() -> list[ModuleType]:
    return [importlib.import_module(path) for path in face_paths("config")]


def engine_problems(values: Values, said: Any, processes: int, cuda: bool, planning: bool) -> list[str]:
    """What stops a run's engine before launch: its install, its settings against the machine and processes."""
    return [problem for room in _rooms()
            for problem in room.engine_problems(values, said, processes, cuda, planning)]


def length_problems(values: Values, completion_field: str, prompt_file: Path | None, column: str) -> list[str]:
    """Prompt + completion must fit the engine's model length."""
    return [problem for room in _rooms() for problem in room.length_problems(values, completion_field, prompt_file,
                                                                             column)]


def tied_head_problems(values: Values, targets: str | list[str] | None) -> list[str]:
    """LoRA targets an engine's copy of the policy cannot follow (a tied embedding and LM head)."""
    return [problem for room in _rooms() for problem in room.tied_head_problems(values, targets)]


def check_server(draft: Any) -> None:
    """A server the run's ranks will wait for: one they can reach."""
    for room in _rooms():
        room.check_server(draft)
