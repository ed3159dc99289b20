"""Every private internal of TRL, transformers, DeepSpeed, accelerate and torch that rlhf relies on, in one place.

rlhf reaches each of them only through a function here, and `INTERNALS` lists each with why we need it and when
it can go. `tests/test_compat.py` resolves the list against the installed versions in seconds (no launch), so an
upgrade that moves one fails that test instead of a run on a GPU node. Used inside ranks and the launch supervisor
only: the CLI never imports this module, and the heavy packages load inside the functions.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

TESTED_WITH = "torch 2.14, transformers 5.24, accelerate 1.15, deepspeed 0.19.8 and trl 1.16"
# The collectives DeepSpeed, accelerate and TRL start, as torch.distributed names them.
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "reduce_scatter",
               "reduce_scatter_tensor", "broadcast", "broadcast_object_list", "barrier", "gather", "gather_object",
               "scatter", "reduce", "all_to_all", "all_to_all_single")


@dataclass(frozen=True)
class Internal:
    path: str  # `package.module:Name.attribute`
    why: str
    until: str  # when rlhf can stop using it
    parameters: tuple[str, ...] = ()  # for a callable: the parameters rlhf passes, by name


INTERNALS = (
    Internal("trl.models.utils:_unwrap_model_for_generation",
             "the one generation context every TRL trainer (and our PPO) enters; wrapped to invalidate ZeRO-3's "
             "stale fetch trace after no-gather generation, and to measure generation",
             "TRL invalidates the trace on its no-gather path (the canary test in tests/launch/test_end_to_end.py "
             "passes)",
             ("model", "accelerator", "gather_deepspeed3_params")),
    Internal("deepspeed.runtime.zero.parameter_offload:DeepSpeedZeRoOffload.get_param_coordinator",
             "reaches the ZeRO-3 parameter coordinator of an engine", "as above"),
    Internal("deepspeed.runtime.zero.partitioned_param_coordinator:PartitionedParameterCoordinator.is_invalid_trace",
             "whether the coordinator's fetch trace is already invalid (invalidating twice raises)", "as above"),
    Internal("deepspeed.runtime.zero.partitioned_param_coordinator:PartitionedParameterCoordinator._invalidate_trace",
             "makes the next forward re-record its fetch trace", "as above"),
    Internal("deepspeed.runtime.zero.parameter_offload:DeepSpeedZeRoOffload._register_deepspeed_module",
             "the gather budget gives the units it gathered ZeRO-3's hooks back after generating",
             "DeepSpeed offers a public way to run chosen modules without its hooks", ("module", "count")),
    Internal("torch.nn.modules.module:Module._forward_pre_hooks",
             "the gather budget finds ZeRO-3's hooks on the units it gathers, to take them off while generating",
             "as above"),
    Internal("torch.nn.modules.module:Module._forward_hooks", "as above", "as above"),
    Internal("deepspeed.runtime.zero.partition_parameters:ZeroParamStatus",
             "the generation probe counts parameters gathered (`ds_status`, `ds_numel`)",
             "DeepSpeed reports gathered parameters itself"),
    Internal("deepspeed.comm.comm:cdb",
             "the generation probe counts all-gather launches on DeepSpeed's communication backend",
             "DeepSpeed's comms logger counts them per call"),
    Internal("transformers:Trainer._prepare_for_training",
             "PPO runs its own loop on Trainer's machinery: model wrapping, DeepSpeed engine, optimizer, scheduler, "
             "checkpoint loading", "never: PPO is ours",
             ("max_steps", "train_dataloader", "resume_from_checkpoint")),
    Internal("transformers:Trainer._save_checkpoint", "PPO saves checkpoints as Trainer does (sharded states, RNG, "
             "trainer_state.json, rotation)", "never: PPO is ours", ("model", "trial")),
    Internal("deepspeed.runtime.engine:DeepSpeedEngine._zero3_consolidated_16bit_state_dict",
             "PPO saves the policy (or only its adapters) from ZeRO-3 shards whatever the accelerate config's "
             "zero3_save_16bit_model says (accelerate's get_state_dict refuses without it and gathers frozen "
             "weights too)", "DeepSpeed or accelerate offer a public consolidated state dict that excludes frozen "
             "parameters", ("exclude_frozen_parameters",)),
    Internal("deepspeed.checkpoint.ds_to_universal:main",
             "a ZeRO-3 checkpoint resumed on another number of processes is converted to DeepSpeed's universal "
             "checkpoint, which any count loads (`checkpoint.load_universal`); `main` is the conversion script's "
             "entry point, called with the arguments its parser would give",
             "DeepSpeed offers the conversion as a function of its own parameters, or loads another world size "
             "directly", ("args",)),
    Internal("transformers:Trainer._load_rng_state", "PPO's resume restores every RNG as Trainer's does",
             "never: PPO is ours", ("checkpoint",)),
    Internal("transformers.trainer_callback:ExportableState",
             "PPO's TrainerState carries the callbacks whose state a checkpoint keeps", "never: PPO is ours"),
    Internal("accelerate.state:GradientState.sync_with_dataloader",
             "PPO turns it off (else accelerate steps at every micro-batch of the loader's last batch); accelerate "
             "has no setter once the Accelerator exists, so rlhf writes the plugin kwargs this property reads",
             "accelerate lets a running Accelerator change sync_with_dataloader"),
    Internal("accelerate.commands.launch:_filter_args",
             "accelerate hands torch's launcher the attributes of its launch arguments that torch's parser knows; "
             "rlhf sets `signals_to_handle` so that SIGUSR1 (SLURM's warning) reaches the ranks",
             "accelerate launch takes --signals_to_handle itself"),
    Internal("accelerate.commands.launch:prepare_deepspeed_cmd_env",
             "accelerate appends the working directory to the ranks' PYTHONPATH, which Python puts ahead of the "
             "standard library: a user's logging.py there would replace it in every rank. rlhf takes it off again "
             "(its start script puts the directory last: rlhf_cli/launch/module_start.py)",
             "accelerate stops adding the working directory to PYTHONPATH", ("args",)),
    Internal("torch.distributed.elastic.multiprocessing.api:SignalException",
             "the launch supervisor tells a signal that stopped the ranks from a rank failure", "torch exports it"),
    Internal("torch.distributed.elastic.multiprocessing.errors:ProcessFailure",
             "the launch supervisor records how each failed rank ended (`ChildFailedError.failures`: local rank, pid, "
             "exit code or signal, time), which a rank killed by a signal cannot record itself",
             "never: public enough", ("local_rank", "pid", "exitcode")),
    *(Internal(f"torch.distributed.distributed_c10d:{name}",
               "wrapped to count the collectives each rank enters: in a stall, the ranks that entered fewer are the "
               "ones the others wait for; the module's own globals too, as torch's collectives call one another",
               "torch reports collectives entered per rank to Python") for name in COLLECTIVES),
    Internal("trl.import_utils:is_vllm_available",
             "a run without vLLM tells TRL that vLLM is absent before TRL's modules import it: TRL imports vLLM "
             "whenever it is installed (seconds of CPU in every rank and in the pre-launch check)",
             "TRL imports vLLM only when a trainer uses it"),
    Internal("trl.trainer.grpo_trainer:GRPOTrainer._tool_call_loop",
             "GRPO's tool-calling turns are made collective (rlhf_cli/rank/agent_turns.py): TRL's loop regenerates "
             "per rank, and ranks whose rollouts take different numbers of turns deadlock in generation",
             "TRL's tool loop takes its turns on every rank together",
             ("prompts", "prompt_ids", "completion_ids", "completions", "logprobs", "images", "multimodal_fields")),
    Internal("trl.trainer.grpo_trainer:GRPOTrainer._generate_single_turn",
             "as above: each regeneration inside the loop is announced to the other ranks, and a rank that left the "
             "loop joins the others' with a throwaway row", "as above",
             ("prompt_ids", "images", "multimodal_fields", "num_generations")),
    Internal("transformers:TrainingArguments._setup_devices",
             "the launcher's pre-launch check builds the trainer config outside any rank: without a process "
             "group, on no device, with the run's number of processes as its world size",
             "TrainingArguments validates its values without setting up devices"),
    Internal("atexit:_run_exitfuncs",
             "a finished rank runs Python's exit handlers (loggers such as wandb finish their runs there), then "
             "leaves without the native teardown in which gloo's or DeepSpeed's CPU-comm threads abort it now and "
             "then (\"terminate called without an active exception\", after the run had saved everything)",
             "torch and DeepSpeed join their threads before the interpreter ends"),
)


class InternalsChanged(RuntimeError):
    """An upgrade moved an internal rlhf relies on; the message names it and the versions rlhf was tested with."""


def locate(path: str) -> Any:
    """The object `package.module:Name.attribute` names; InternalsChanged when it is gone."""
    module_name, _, attributes = path.partition(":")
    try:
        found: Any = importlib.import_module(module_name)
        for attribute in attributes.split("."):
            found = _attribute(found, attribute)
    except (ImportError, AttributeError) as error:
        raise InternalsChanged(f"{path} is gone ({error}); rlhf was tested with {TESTED_WITH}. "
                               "Install the tested versions, or an rlhf release that supports yours.") from None
    return found


def _attribute(owner: Any, name: str) -> Any:
    """`owner.name`; for a class, also an attribute every instance has, declared by the class's annotations
    (torch's `Module._forward_hooks`): then its annotation."""
    try:
        return getattr(owner, name)
    except AttributeError:
        annotations = getattr(owner, "__annotations__", {}) if isinstance(owner, type) else {}
        if name in annotations:
            return annotations[name]
        raise


def check(internal: Internal) -> None:
    """Raise InternalsChanged unless `internal` exists and takes the parameters rlhf passes."""
    found = locate(internal.path)
    if internal.parameters:
        taken = inspect.signature(found).parameters
        missing = [name for name in internal.parameters if name not in taken]
        if missing:
            raise InternalsChanged(f"{internal.path} no longer takes {', '.join(missing)}; rlhf was tested with "
                                   f"{TESTED_WITH}")


# -- TRL's generation context ---------------------------------------------------------------------------------

def trl_generation_context() -> Any:
    """TRL's private generation context manager, as installed (or as rlhf wrapped it)."""
    return locate(INTERNALS[0].path)


def replace_trl_generation_context(wrapper: Any) -> None:
    """Make every TRL trainer (and our PPO) generate through `wrapper`: the public
    `unwrap_model_for_generation` looks the private one up in its module at each call."""
    import trl.models.utils

    trl.models.utils._unwrap_model_for_generation = wrapper


def keep_trl_from_importing_vllm() -> None:
    """Make TRL's modules imported from now on see no vLLM (each reads `is_vllm_available` when it is imported);
    for a run that does not generate with vLLM. A module TRL imported already keeps what it saw."""
    importlib.import_module("trl.import_utils").is_vllm_available = _vllm_absent


def _vllm_absent(min_version: str | None = None) -> bool:
    return False


# -- DeepSpeed ZeRO-3 --------------------------------------------------------------------------------------------

def zero3_parameter_offload(engine: Any) -> Any | None:
    """The object that holds a DeepSpeed engine's ZeRO-3 hooks and coordinator, or None (not ZeRO-3, not prepared)."""
    optimizer = getattr(engine, "optimizer", None)
    if optimizer is None:
        return None
    offload = getattr(optimizer, "parameter_offload", optimizer)  # engines without optimizer hold it directly
    return offload if hasattr(offload, "get_param_coordinator") else None


def zero3_param_coordinator(engine: Any) -> Any | None:
    """The ZeRO-3 parameter coordinator of a DeepSpeed engine, or None (not ZeRO-3, not prepared yet)."""
    offload = zero3_parameter_offload(engine)
    return offload.get_param_coordinator() if offload is not None else None


def invalidate_fetch_trace(engine: Any) -> None:
    """Make the engine's next forward re-record which parameters to fetch, and when."""
    coordinator = zero3_param_coordinator(engine)
    if coordinator is None:
        return
    if not (hasattr(coordinator, "is_invalid_trace") and hasattr(coordinator, "_invalidate_trace")):
        raise InternalsChanged(f"DeepSpeed's ZeRO-3 parameter coordinator changed; rlhf's --no-gather fix was "
                               f"written for {TESTED_WITH}. Use --gather, or install the tested versions.")
    if not coordinator.is_invalid_trace():  # invalidating twice raises
        coordinator._invalidate_trace()


def remove_zero3_hooks(engine: Any, modules: list[Any]) -> None:
    """Take ZeRO-3's forward and backward hooks off `modules` (every other hook on them stays): they no longer
    fetch, release or trace anything until `register_zero3_hooks` puts the hooks back."""
    offload = _hooked_offload(engine)
    ids = {hook_id for module in modules for hook_id in (*module._forward_pre_hooks, *module._forward_hooks)}
    for handle in (*offload.forward_hooks, *offload.backward_hooks):
        if handle.id in ids:
            handle.remove()
    offload.forward_hooks = [handle for handle in offload.forward_hooks if handle.id not in ids]
    offload.backward_hooks = [handle for handle in offload.backward_hooks if handle.id not in ids]


def register_zero3_hooks(engine: Any, roots: list[Any]) -> None:
    """Give each module under `roots` (each root with all its submodules) ZeRO-3's hooks again, as DeepSpeed
    registered them at the start (TRL's `add_hooks` does the same for the whole model after gathering).

    Each module keeps the `ds_id` it had: DeepSpeed numbers modules from one counter shared by every call, so
    registering again would give a unit's root the id of the last module registered and its submodules fresh ones,
    and two modules of one engine would share an id (the coordinator keys fetches, releases and each parameter's
    active modules by it)."""
    offload = _hooked_offload(engine)
    for root in roots:
        ids = {module: module.ds_id for module in root.modules()}
        offload._register_deepspeed_module(root, count=[root.ds_id])  # its own counter: the shared one stays put
        for module, ds_id in ids.items():
            module.ds_id = ds_id


def _hooked_offload(engine: Any) -> Any:
    offload = zero3_parameter_offload(engine)
    if offload is None or not (hasattr(offload, "forward_hooks") and hasattr(offload, "backward_hooks")):
        raise InternalsChanged(f"DeepSpeed's ZeRO-3 hooks changed; rlhf's gather budget was written for "
                               f"{TESTED_WITH}. Use --gather or --no-gather, or install the tested versions.")
    return offload


def zero3_param_states() -> tuple[Any, Any]:
    """(gathered, partitioned): the `ds_status` values of a ZeRO-3 parameter fully present, and not present."""
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    return ZeroParamStatus.AVAILABLE, ZeroParamStatus.NOT_AVAILABLE


def deepspeed_comm_backend() -> Any | None:
    """DeepSpeed's communication backend object (None before deepspeed.init_distributed)."""
    import deepspeed.comm.comm as ds_comm

    return ds_comm.cdb


# -- transformers' Trainer, for PPO's own loop -------------------------------------------------------------------

def prepare_for_training(trainer: Any, max_steps: int, loader: Any, resume_from_checkpoint: str | None) -> Any:
    """(model, loader) wrapped as Trainer.train would: DeepSpeed engine, optimizer, scheduler, checkpoint loaded."""
    return trainer._prepare_for_training(max_steps, loader, resume_from_checkpoint)


def zero3_consolidated_state(engine: Any, exclude_frozen: bool) -> dict[str, Any] | None:
    """The whole 16-bit state dict of a ZeRO-3 engine on global rank 0 (None elsewhere; every rank must call it),
    without the frozen parameters when `exclude_frozen`."""
    return engine._zero3_consolidated_16bit_state_dict(exclude_frozen_parameters=exclude_frozen)


def save_checkpoint(trainer: Any, model: Any) -> None:
    trainer._save_checkpoint(model, trial=None)


def load_rng_state(trainer: Any, checkpoint: str) -> None:
    trainer._load_rng_state(checkpoint)


def convert_to_universal(shards: Any, universal: Any) -> None:
    """DeepSpeed's universal checkpoint of the shards in folder `shards` (a checkpoint's `global_stepN`), written
    to folder `universal`, with `latest_universal` beside it naming it. One worker each: it runs inside a rank,
    where forked workers would inherit the rank's accelerator state."""
    import argparse

    from deepspeed.checkpoint import ds_to_universal

    ds_to_universal.main(argparse.Namespace(input_folder=str(shards), output_folder=str(universal),
                                            num_extract_workers=1, num_merge_workers=1, keep_temp_folder=False,
                                            strict=True, inject_missing_state=False))


def stop_sync_with_dataloader(accelerator: Any) -> None:
    """Gradients accumulate over the loader's last batch like over any other."""
    accelerator.gradient_state.plugin_kwargs["sync_with_dataloader"] = False


def exportable_state_class() -> type:
    from transformers.trainer_callback import ExportableState

    return ExportableState


def count_collectives(on_enter: Callable[[], None]) -> None:
    """Call `on_enter` as each collective of COLLECTIVES starts, in this process, whoever starts it. Install it
    before DeepSpeed starts: its backend keeps references to some of these functions."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    for name in COLLECTIVES:
        original = getattr(distributed_c10d, name)

        @functools.wraps(original)
        def counted(*args: Any, _original: Callable = original, **kwargs: Any) -> Any:
            on_enter()
            return _original(*args, **kwargs)

        setattr(distributed_c10d, name, counted)
        if getattr(dist, name, None) is original:
            setattr(dist, name, counted)


# -- GRPO's tool loop ---------------------------------------------------------------------------------------------

def trl_tool_turns(trainer: Any) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """(the tool loop, the single-turn generation) of a GRPOTrainer, bound to it, as TRL defines them."""
    return trainer._tool_call_loop, trainer._generate_single_turn


def replace_trl_tool_turns(trainer: Any, tool_call_loop: Callable[..., Any], single_turn: Callable[..., Any]) -> None:
    """Make this trainer (only) run its tool loop and its single-turn generation through rlhf's functions; its
    `_generate` looks both up on the instance at each call."""
    trainer._tool_call_loop = tool_call_loop
    trainer._generate_single_turn = single_turn


# -- transformers' TrainingArguments, built outside a rank -------------------------------------------------------

def detached_config_class(config_class: type, processes: int) -> type:
    """`config_class` (a TrainingArguments dataclass) as a rank of a `processes`-process run validates it, but
    built where no rank is: its __post_init__ sets up no device and no process group (transformers would start
    one, or take the GPU, in whatever process builds it) and sees the run's world size, on which its batch
    checks depend."""
    import torch

    class Detached(config_class):  # type: ignore[misc, valid-type]
        @property
        def world_size(self) -> int:
            return processes

        @property
        def _setup_devices(self) -> torch.device:
            return torch.device("cpu")

    Detached.__name__ = Detached.__qualname__ = config_class.__name__
    return Detached


def run_exit_handlers() -> None:
    """Python's atexit handlers, now (see INTERNALS: the rank leaves with os._exit after them)."""
    import atexit

    atexit._run_exitfuncs()
