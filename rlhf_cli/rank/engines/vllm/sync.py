"""TRL's colocated vLLM (RLOO, GRPO, online DPO; PPO's rollouts) synced through rlhf's weight sync
(rlhf_cli/rank/engines/weights.py): bucketed by the run's gather choice, a shard-local delta after the first sync
(rlhf_cli/rank/engines/delta.py), checked by the logprob self-check (rlhf_cli/rank/engines/vllm/self_check.py)."""

from __future__ import annotations

from typing import Any

from rlhf_cli.compat import vllm as vllm_compat
from rlhf_cli.generation.choice import Gather
from rlhf_cli.rank.engines.sync import sync_weights
from rlhf_cli.rank.engines.weights import SyncLimit
from rlhf_cli.rank.engines.vllm.target import ColocatedVLLM


def install_vllm(gather: Gather, dtype: str, seed: int, check: Any) -> None:
    """Make TRL's colocated vLLM hold the policy in `dtype`, the one the trainer holds it in (vLLM would downcast a
    float32 model to bfloat16), sample from the recipe's `seed` (plus TRL's per-rank offset), and sync through
    `sync_weights`, bucketed by the run's gather choice and checked by `check` (a
    rlhf_cli/rank/engines/vllm/self_check.SyncCheck). Server mode keeps TRL's own sync (NCCL to the server)."""

    def engine(*args: Any, **kwargs: Any) -> Any:  # trl's `LLM(...)`
        kwargs.setdefault("dtype", dtype)
        kwargs["seed"] = seed + kwargs.get("seed", 0)  # TRL's: the rank's tensor-parallel group, from 0
        return engine.__wrapped__(*args, **kwargs)

    def sync_generation(generation: Any) -> None:  # trl VLLMGeneration.sync_weights
        if generation.mode != "colocate":
            return sync_generation.__wrapped__(generation)
        if generation.enable_sleep_mode:  # as TRL: the weights must be mapped before they are written
            from trl.generation.vllm_generation import empty_cache

            empty_cache()  # TRL's: what the trainer freed goes back to the device before vLLM maps its weights
            generation.llm.wake_up(tags=["weights"])
            generation._llm_weights_sleeping = False
        sync_weights(generation.model, ColocatedVLLM.of(generation.llm, check),
                     SyncLimit.of(gather, generation.model), woke=generation.enable_sleep_mode)

    def sync_online_dpo(trainer: Any) -> None:  # trl OnlineDPOTrainer._move_model_to_vllm
        if trainer.vllm_mode != "colocate":
            return sync_online_dpo.__wrapped__(trainer)
        sync_weights(trainer.model, ColocatedVLLM.of(trainer.llm, check), SyncLimit.of(gather, trainer.model),
                     woke=bool(trainer.args.vllm_enable_sleep_mode))

    vllm_compat.replace_trl_vllm_engine(engine)
    vllm_compat.replace_trl_vllm_sync(sync_generation, sync_online_dpo)
