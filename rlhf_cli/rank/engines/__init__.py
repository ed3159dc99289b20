"""The ranks' side of each generation engine: the engine-neutral weight sync (weights.py, sync.py, delta.py)
and one folder per engine (`vllm/`); the policy's own `generate` (hf) needs none.

A separate engine's folder (its registry row's `rank` face) offers `install(config, inputs)`, run once the
trainer's config exists, `refuse_resized_policy(policy_path, rows, now)` for a policy whose embedding grew, and
`remove_transfers(output_dir)`, run on rank 0 when the ranks are done, for what its syncs left in the run's
directory.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

from rlhf_cli.generation.engines import EngineSpec

# The rank record's keys for a separate engine (rlhf_cli/rank/record.py): its weight syncs and the generation calls
# of PPO's rollouts; named when vLLM was the only one (the benchmarks read them)
SYNC_RECORD_KEY, GENERATION_SECONDS_KEY = "vllm_sync", "vllm_generation_seconds"


def prepare_engine(spec: EngineSpec) -> None:
    """What a rank sets up for its engine before the trainer is built: the engine's CPU settings (unless the run
    set them), and for a vLLM server a wait that ends at `vllm_server_timeout` (TRL's own never ends while a
    wrong server answers)."""
    for variable, value in spec.cpu_environment.items():
        os.environ.setdefault(variable, value)
    if spec.is_server and spec.is_vllm:
        from rlhf_cli.compat.vllm import replace_trl_server_wait
        from rlhf_cli.rank.engines.vllm.server import wait_for_server

        replace_trl_server_wait(wait_for_server)


def engine_room(spec: EngineSpec) -> ModuleType | None:
    """The ranks' code for a separate engine (its registry row's `rank` face), imported now; None for the policy's
    own `generate`."""
    path = spec.faces.get("rank")
    return importlib.import_module(path) if path else None


def hide_unused_engines(spec: EngineSpec) -> None:
    """A run imports only the engine it generates with (TRL imports vLLM wherever it is installed)."""
    if not spec.is_vllm:
        from rlhf_cli import compat

        compat.keep_trl_from_importing_vllm()
