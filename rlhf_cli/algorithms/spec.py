"""What the registry knows about one algorithm: every fact another layer needs, as data and pure functions.

Torch-free and free of other rlhf imports, so that the CLI, the config layer, the planner and the ranks can all
read it. A field that names code to run inside a rank (`builder`, `config_class`, `trainer_class`) is an import
path, imported only where it runs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

Values = Callable[[str], Any]  # a resolved recipe key -> its value (the default when unset)
FIELD_DEFAULT = object()  # a starter entry whose value is the field's default


@dataclass(frozen=True)
class StarterEntry:
    """One line of `rlhf init`'s starter recipe."""

    key: str
    comment: str
    value: Any = FIELD_DEFAULT
    enabled: bool = True  # False: written commented out, for keys most runs leave unset


@dataclass(frozen=True)
class Batches:
    """Sequences per process in each phase of one step, as the trainer forms them."""

    generation: int  # generated together
    train: int  # one training micro-batch (forward and backward)
    score: int  # one no-grad scoring forward pass (old log-probs, reference, reward)


@dataclass(frozen=True)
class StepWork:
    """Sequences per process in one optimizer step, by what is done with them (the time plan's counts)."""

    generated: float  # sampled; a share of one generation round when a round feeds several optimizer steps
    trained: int  # forward and backward passes, one per sequence and pass over it
    old_logprobs: bool  # the policy scores the generated sequences without gradients (its old log-probs)
    old_logprobs_with_vllm: bool  # the same when vLLM generates (TRL's importance-sampling correction)
    syncs: float  # weight syncs to vLLM: one per generation round after an update

    def scores_old_logprobs(self, separate_engine: bool) -> bool:
        """Whether the step scores the policy's old log-probs, when a separate engine samples or the policy does."""
        return self.old_logprobs_with_vllm if separate_engine else self.old_logprobs


@dataclass(frozen=True)
class LogitsModel:
    """What one trainer holds at once to score tokens: [tokens, vocabulary] tensors, or a fused head's buffers.
    Each entry cites the trainer code it was read from; the plan (rlhf_cli/plan/memory.py) turns it into bytes."""

    sequence_copies: int = 0  # [prompt + completion, vocabulary] tensors in the model's dtype
    completion_copies: int = 0  # [completion, vocabulary] tensors in the model's dtype
    fused_head: bool = False  # TRL's chunked LM head: no [tokens, vocabulary] tensor at all


def no_checks(values: Values, num_processes: int) -> list[str]:
    return []


def unset(*_: Any) -> Any:
    """The default of a function field an entry left out; the registry test fails on it before any command does."""
    raise NotImplementedError("this algorithm's registry entry lacks a function field; see tests/test_algorithms.py")


def load_object(path: str) -> Any:
    """The object an import path `package.module:name` names (a builder, a config class), imported now."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class Algorithm:
    """One algorithm: its command, its trainer and config, and what the plan, the starter and the CLI need."""

    name: str  # the schema file, the recipes folder and the resolved run's algorithm: `online_dpo`
    command: str  # `rlhf online-dpo`
    # Every other field has a default, so that an entry lacking one fails the registry test, not every command.
    summary: str = ""  # the command's help
    example: str = ""  # shown under the command's help
    config_name: str = ""  # the trainer config as people know it: `trl.RLOOConfig`
    config_class: str = ""  # `module:Class` whose fields are the recipe's trainer keys (the schema snapshot)
    script_class: str = ""  # `module:Class` of TRL's script arguments for this trainer (dataset and reward keys)
    builder: str = ""  # `module:function` building the trainer from RankInputs; imported inside ranks only
    trainer_class: str = ""  # `module:Class` of the trainer the builder makes (one builder serves TRL's RLOO, GRPO)
    completion_field: str = ""  # the key bounding generated tokens
    batch_fields: tuple[str, ...] = ()  # batch keys the plan may propose to lower when a run does not fit
    batches: Callable[[Values, int], Batches] = unset  # (values, processes in total) -> per-process batches
    step_work: Callable[[Values], StepWork] = unset  # values -> what one optimizer step does, per process
    has_reference: Callable[[Values], bool] = unset  # whether the trainer builds a frozen reference policy
    trains_value_model: bool = False  # PPO: a value model trained beside the policy
    bf16_unless_told: bool = True  # TRL's configs turn bf16 on when neither bf16 nor fp16 is set
    sequence_cap_field: str | None = None  # a key capping prompt + completion tokens in training (online DPO)
    logits: LogitsModel | None = None  # how the trainer scores tokens, for the plan
    headline_metrics: tuple[tuple[str, str], ...] = ()  # (logged metric, label) for the progress line and summary
    renamed: Mapping[str, str] = field(default_factory=dict)  # an older name -> today's key
    retired: Mapping[str, str] = field(default_factory=dict)  # an older key with no counterpart -> what to do
    starter: tuple[StarterEntry, ...] = ()  # the Training section of `rlhf init`
    starter_models: tuple[StarterEntry, ...] = ()  # extra entries in the "What to train" section
    checks: Callable[[Values, int], list[str]] = no_checks  # (values, processes) -> problems found before launch
    # the keyword arguments the trainer calls each reward function with (TRL's also pass the dataset's other
    # columns: a function takes them, or **kwargs)
    reward_keywords: tuple[str, ...] = ()
    takes_tools: bool = False  # the trainer takes `tools`, `environment_factory` and `rollout_func` (GRPO)
    # engine name -> `module:function` making the trainer sync that engine's weights through rlhf's weight sync
    # (replacing the trainer's own); imported inside ranks only
    sync_hooks: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "renamed", MappingProxyType(dict(self.renamed)))
        object.__setattr__(self, "sync_hooks", MappingProxyType(dict(self.sync_hooks)))
        object.__setattr__(self, "retired", MappingProxyType(dict(self.retired)))

    def headline(self, logs: Mapping[str, Any]) -> list[tuple[str, float]]:
        """(label, value) of each headline metric present in one log entry."""
        return [(label, logs[key]) for key, label in self.headline_metrics
                if isinstance(logs.get(key), (int, float)) and not isinstance(logs.get(key), bool)]

    def format_metrics(self, logs: Mapping[str, Any]) -> str:
        """`reward 0.412  kl 0.0031  loss -0.05`: the headline numbers of one log entry."""
        return "  ".join(f"{label} {value:.4g}" for label, value in self.headline(logs))
