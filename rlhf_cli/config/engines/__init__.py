"""A run's settings for each generation engine, read and checked before anything starts: `vllm` (TRL's `vllm_*`
keys, the installed version, lengths) and `vllm_server` (the server a run's ranks will talk to); and the keys of
rlhf's own an engine adds to every recipe (`ENGINE_FIELDS`, in the catalogue of rlhf_cli/config/fields.py)."""

from __future__ import annotations

from rlhf_cli.config.field_types import Field
from rlhf_cli.generation.engines import SYNC_CHECK_KEY

ENGINE_FIELDS = (
    Field(SYNC_CHECK_KEY, "launch", ("int",), 10,
          "With vLLM colocated: compare vLLM's logprobs with the policy's on a fixed probe after the first weight "
          "sync, after every wake from sleep and every this many syncs; the run stops when they differ. 0: never."),
)
