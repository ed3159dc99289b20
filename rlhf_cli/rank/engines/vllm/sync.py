"""TRL's colocated vLLM (RLOO, GRPO, online DPO; PPO's rollouts) synced through rlhf's weight sync
(rlhf_cli/rank/engines/weights.py): bucketed by the run's gather choice, a shard-local delta after the first sync
(rlhf_cli/rank/engines/delta.py), checked by the logprob self-check (rlhf_cli/rank/engines/vllm/self_check.py).
Their `--vllm server` too: the weights go to `rlhf vllm-serve` through the run's directory
(rlhf_cli/rank/engines/vllm/server.ServerTarget), never through TRL's NCCL communicator (CUDA on both sides)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlhf_cli.algorithms.spec import load_object
from rlhf_cli.compat import vllm as vllm_compat
from rlhf_cli.config.engines.vllm_lora import LoraServing
from rlhf_cli.generation.choice import Gather
from rlhf_cli.generation.engines import engine_of
from rlhf_cli.phases import StepPhase
from rlhf_cli.rank.engines.sync import sync_weights
from rlhf_cli.rank.engines.vllm.adapters import engine_arguments, serve_lora
from rlhf_cli.rank.engines.vllm.server import WEIGHT_DIR, ServerTarget
from rlhf_cli.rank.engines.vllm.target import ColocatedVLLM
from rlhf_cli.rank.engines.weights import SyncLimit
from rlhf_cli.rank.phases import StepPhases


@dataclass(frozen=True)
class SyncSettings:
    """What a trainer's replaced sync needs of the run: its gather choice, the self-check, the run's directory,
    whether a sync may be a delta."""

    gather: Gather  # how much of a ZeRO-3 policy one sync gathers at once
    check: Any  # a rlhf_cli/rank/engines/vllm/self_check.SyncCheck of the colocated engine's syncs
    output_dir: str  # whose weight directory a server is synced through
    delta: bool = True  # the recipe's `weight_sync_delta`: False sends every weight at every sync


def install_vllm(gather: Gather, dtype: str, seed: int, check: Any, output_dir: str, sync_hook: str,
                 delta: bool = True, lora: LoraServing | None = None) -> None:
    """Make TRL's colocated vLLM hold the policy in `dtype`, the one the trainer holds it in (vLLM would downcast a
    float32 model to bfloat16), sample from the recipe's `seed` (plus TRL's per-rank offset), and sync through
    `sync_weights`, bucketed by the run's gather choice and checked by `check` (a
    rlhf_cli/rank/engines/vllm/self_check.SyncCheck). `sync_hook` is the algorithm's (its registry entry's
    `sync_hooks`): the `module:function` that replaces its trainer's own sync. A server is synced through
    `output_dir`'s weight directory (`server_target`); TRL's NCCL communicator is never set up, and the server's
    weight version is checked before TRL's first generation from it. `delta` False (`weight_sync_delta: false`):
    every sync sends every weight. `lora`: whether a LoRA run's colocated vLLM serves the adapters itself
    (rlhf_cli/config/engines/vllm_lora.py), which its syncs then send alone (rlhf_cli/rank/engines/adapters.py); a
    server the same (rlhf_cli/rank/engines/vllm/server_lora.py)."""

    def engine(*args: Any, **kwargs: Any) -> Any:  # trl's `LLM(...)`
        kwargs.setdefault("dtype", dtype)
        kwargs["seed"] = seed + kwargs.get("seed", 0)  # TRL's: the rank's tensor-parallel group, from 0
        llm = engine.__wrapped__(*args, **{**kwargs, **engine_arguments(lora)})
        serve_lora(llm, lora, output_dir)
        return llm

    ServerTarget.lora = lora  # a server serves the adapters as the colocated engine would
    vllm_compat.replace_trl_vllm_engine(engine)
    load_object(sync_hook)(SyncSettings(gather, check, output_dir, delta))
    vllm_compat.replace_trl_vllm_server_transport(check_server_version)
    vllm_compat.replace_trl_vllm_generate(lambda: StepPhases.current().during(StepPhase.GENERATION))


def hook_vllm_generation(settings: SyncSettings) -> None:
    """RLOO's, GRPO's and PPO's colocated vLLM (TRL's VLLMGeneration, whose `sync_weights` a sleeping engine calls
    when it wakes) sync through rlhf's weight sync."""

    def sync_generation(generation: Any) -> None:  # trl VLLMGeneration.sync_weights
        limit = SyncLimit.of(settings.gather, generation.model)
        if generation.mode == "server":
            sync_weights(generation.model, server_target(generation, "vllm_client", settings.output_dir), limit,
                         delta=settings.delta)
            return None
        if generation.enable_sleep_mode:  # as TRL: the weights must be mapped before they are written
            from trl.generation.vllm_generation import empty_cache

            empty_cache()  # TRL's: what the trainer freed goes back to the device before vLLM maps its weights
            generation.llm.wake_up(tags=["weights"])
            generation._llm_weights_sleeping = False
        sync_weights(generation.model, ColocatedVLLM.of(generation.llm, settings.check), limit,
                     woke=generation.enable_sleep_mode, delta=settings.delta)

    vllm_compat.replace_trl_generation_sync(sync_generation)


def hook_online_dpo(settings: SyncSettings) -> None:
    """TRL's OnlineDPOTrainer syncs its own vLLM (colocated or a server) through rlhf's weight sync, times its vLLM
    generation as the step's `generation` phase (as RLOO's and GRPO's), and starts server mode on ranks without an
    accelerator (it asks for one only to set up the NCCL communicator rlhf skips)."""

    def sync_online_dpo(trainer: Any) -> None:  # trl OnlineDPOTrainer._move_model_to_vllm
        limit = SyncLimit.of(settings.gather, trainer.model)
        if engine_of(lambda key: getattr(trainer.args, key, None)).is_server:
            sync_weights(trainer.model, server_target(trainer, "vllm_client", trainer.args.output_dir), limit,
                         delta=settings.delta)
            return None
        sync_weights(trainer.model, ColocatedVLLM.of(trainer.llm, settings.check), limit,
                     woke=bool(trainer.args.vllm_enable_sleep_mode), delta=settings.delta)

    vllm_compat.replace_trl_online_dpo_sync(sync_online_dpo)
    vllm_compat.replace_trl_online_dpo_generate(lambda: StepPhases.current().during(StepPhase.GENERATION))
    vllm_compat.replace_trl_online_dpo_server_device()


def server_target(owner: Any, client_attribute: str, output_dir: str) -> ServerTarget:
    """The server target of a TRL generator or trainer (one per owner: it counts the syncs it sent), with the
    `VLLMClient` TRL built on rank 0 (None elsewhere)."""
    target = getattr(owner, "rlhf_server_target", None)
    if target is None:
        from accelerate import PartialState

        client = getattr(owner, client_attribute, None)
        target = owner.rlhf_server_target = ServerTarget(client, PartialState(), Path(output_dir, WEIGHT_DIR))
    return target


def check_server_version(client: Any) -> None:
    """Before a TRL `VLLMClient` generates: the server holds this run's last weights (ServerTarget.check_version);
    a client no sync went through has sent none."""
    target = getattr(client, "rlhf_server_target", None)
    if target is None:
        target = ServerTarget(client, None, Path())
    target.check_version()
