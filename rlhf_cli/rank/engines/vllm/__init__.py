"""The ranks' side of vLLM: the weight sync from ZeRO-3 shards, the server transport, PPO's rollouts from vLLM.

Its registry row's `rank` face names this package: `install` and `refuse_resized_policy` are what the builders ask
of a separate engine, `remove_transfers` what a finished run asks (rlhf_cli/rank/engines/__init__.py
`engine_room`).
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Any

from rlhf_cli.generation.engines import SYNC_CHECK_KEY, USE_VLLM_KEY


def install(config: Any, inputs: Any) -> None:
    """TRL's colocated vLLM in the policy's training dtype, synced within the run's gather choice by the run's
    algorithm's hook (its registry entry's `sync_hooks`); a server synced the same way, through the run's
    directory. `config` is the trainer's config, `inputs` the rank's RankInputs."""
    from rlhf_cli.algorithms import algorithm
    from rlhf_cli.models.dtype import training_dtype
    from rlhf_cli.rank.engines.vllm.self_check import SyncCheck
    from rlhf_cli.rank.engines.vllm.sync import install_vllm

    dtype = training_dtype(config.bf16, config.fp16, (config.model_init_kwargs or {}).get("dtype"),
                           inputs.model_value("model_name_or_path"))
    generation = inputs.generation()
    install_vllm(generation.gather, dtype=dtype, seed=config.seed,
                 check=SyncCheck(inputs.launch_value(SYNC_CHECK_KEY)), output_dir=config.output_dir,
                 sync_hook=algorithm(inputs.algorithm).sync_hooks[generation.engine.name],
                 delta=inputs.launch_value("weight_sync_delta"), lora=run_lora_serving(inputs))


def run_lora_serving(inputs: Any) -> Any:
    """Whether the run's vLLM serves its adapters (rlhf_cli/config/engines/vllm_lora.py), for the policy's
    architecture as its config.json lays it out."""
    from rlhf_cli.config.engines.vllm_lora import run_lora_serving as decided

    return decided(inputs.value, inputs.model_value("model_name_or_path"), inputs.model_value("model_revision"),
                   inputs.value("env"))


def refuse_resized_policy(policy_path: str, rows: int, now: int) -> None:
    """vLLM loads the checkpoint's embedding rows: a policy resized for the pad token PPO added (a hub policy the
    pre-launch check could not read, rlhf_cli/algorithms/ppo.py resized_for_pad) would not match it."""
    if now != rows:
        raise ValueError(f"{USE_VLLM_KEY}: {policy_path} was resized from {rows} rows for the pad token PPO added, "
                         "and vLLM holds the checkpoint's: save the policy with a pad token of its own first, or "
                         "drop --vllm")


def remove_transfers(output_dir: Path) -> None:
    """What the syncs left in the run's directory that nothing reads any more: the server's weight files (a whole
    copy of the policy after a dense sync) and the adapters a colocated vLLM loaded. The adapter a server serves
    stays (`vllm-lora/server`, a few MB): vLLM reads it again whenever its LoRA cache drops it, and it serves it
    after the run."""
    from rlhf_cli.rank.engines.vllm.adapters import LORA_DIR, RANK_FOLDER
    from rlhf_cli.rank.engines.vllm.server import WEIGHT_DIR

    shutil.rmtree(output_dir / WEIGHT_DIR, ignore_errors=True)
    for colocated in (output_dir / LORA_DIR).glob(f"{RANK_FOLDER}*"):
        shutil.rmtree(colocated, ignore_errors=True)
    with contextlib.suppress(OSError):
        (output_dir / LORA_DIR).rmdir()  # when nothing is left in it
