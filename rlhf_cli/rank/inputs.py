"""What every trainer builder needs from a resolved recipe: its groups, the dataset, the rewards."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from rlhf_cli.algorithms import algorithm
from rlhf_cli.config.data_files import DATA_SUFFIXES
from rlhf_cli.config.fields import catalogue, trl_reward_factory_arguments
from rlhf_cli.generation.choice import Generation


@dataclass(frozen=True)
class RankInputs:
    """The resolved recipe, split by who consumes each key."""

    algorithm: str
    script: dict[str, Any]
    model: dict[str, Any]
    trainer: dict[str, Any]
    zero3: dict[str, Any]
    launch: dict[str, Any]

    @classmethod
    def read(cls, algorithm: str, recipe_path: Path) -> RankInputs:
        return cls.from_values(algorithm, yaml.safe_load(recipe_path.read_text()) or {})

    @classmethod
    def from_values(cls, algorithm: str, values: dict[str, Any]) -> RankInputs:
        fields = catalogue(algorithm)
        groups: dict[str, dict[str, Any]] = {"script": {}, "model": {}, "trainer": {}, "zero3": {}, "launch": {}}
        for name, value in values.items():
            groups[fields[name].group][name] = value
        return cls(algorithm, groups["script"], groups["model"], groups["trainer"], groups["zero3"], groups["launch"])

    def generation(self) -> Generation:
        """How the policy generates, from the resolved recipe's keys (resolution checked them)."""
        return Generation.from_values(lambda name: {**self.trainer, **self.launch}.get(name))

    def hide_unused_engines(self) -> None:
        """A run imports only the engine it generates with (rlhf_cli/rank/engines `hide_unused_engines`)."""
        from rlhf_cli.rank.engines import hide_unused_engines

        hide_unused_engines(self.generation().engine.spec)

    def value(self, name: str) -> Any:
        """A key's value, in whichever group holds it."""
        field = catalogue(self.algorithm)[name]
        return getattr(self, field.group).get(name, field.default)

    def script_value(self, name: str) -> Any:
        return self.script.get(name, catalogue(self.algorithm)[name].default)

    def launch_value(self, name: str) -> Any:
        return self.launch.get(name, catalogue(self.algorithm)[name].default)

    def model_value(self, name: str) -> Any:
        return self.model.get(name, catalogue(self.algorithm)[name].default)

    def model_init_kwargs(self) -> dict[str, Any]:
        """How TRL's own scripts load models, from the recipe's model keys."""
        kwargs = {
            "revision": self.model_value("model_revision"),
            "trust_remote_code": self.trainer.get("trust_remote_code"),  # a trainer key, as in TRL's scripts
            "attn_implementation": self.model_value("attn_implementation"),
            "dtype": self.model_value("dtype"),
        }
        kwargs.update(self._quantization())
        kwargs.update(self.trainer.get("model_init_kwargs") or {})
        return kwargs

    def _quantization(self) -> dict[str, Any]:
        """QLoRA's loading as TRL's scripts do it (`get_quantization_config`), when load_in_4bit or load_in_8bit is
        set; the resolver refuses them where there is no CUDA for bitsandbytes."""
        if not (self.model_value("load_in_4bit") or self.model_value("load_in_8bit")):
            return {}
        import dataclasses

        from trl import ModelConfig, get_kbit_device_map, get_quantization_config

        names = {field.name for field in dataclasses.fields(ModelConfig)}
        model_args = ModelConfig(**{name: value for name, value in self.model.items() if name in names})
        return {"quantization_config": get_quantization_config(model_args), "device_map": get_kbit_device_map()}

    def config_values(self, **model_init: Any) -> dict[str, Any]:
        """The trainer config's arguments: the recipe's trainer keys, model loading as TRL's scripts do it."""
        return {**self.trainer, "model_init_kwargs": {**self.model_init_kwargs(), **model_init}}


def load_prompts(inputs: RankInputs):
    """The train split (and test split when evaluating), with the prompt column named `prompt`: from
    `dataset_name`, or from TRL's mixture of `datasets` as `trl ALGO --config` loads it. Neither: no split (GRPO's
    environment owns the data)."""
    from datasets import load_dataset

    name = inputs.script_value("dataset_name")
    if name is None and not inputs.script_value("datasets"):
        return None, None
    train_split = inputs.script_value("dataset_train_split")
    if inputs.script_value("datasets"):
        from trl import DatasetMixtureConfig, get_dataset

        dataset = get_dataset(DatasetMixtureConfig(
            datasets=[dict(entry) for entry in inputs.script_value("datasets")],
            streaming=inputs.script_value("streaming"), test_split_size=inputs.script_value("test_split_size")))
    elif Path(name).is_file():
        dataset = load_dataset(DATA_SUFFIXES[Path(name).suffix], data_files={"train": name})
        train_split = "train"
    else:
        dataset = load_dataset(name, name=inputs.script_value("dataset_config"),
                               streaming=inputs.script_value("dataset_streaming"))
    column = inputs.script_value("dataset_prompt_column")
    if column != "prompt":
        dataset = dataset.rename_column(column, "prompt")
    test_split = inputs.script_value("dataset_test_split")
    evaluate = inputs.trainer.get("eval_strategy", "no") != "no"
    return dataset[train_split], dataset[test_split] if evaluate else None


def load_reward_function(algorithm_name: str, spec: str) -> Any:
    """TRL's reward function by its bare name (a factory called as TRL's scripts call it), or `module:function`,
    `path/to/file.py:function`, TRL's `module.function`. Importing runs the module's code."""
    if ":" not in spec and "." not in spec:
        from trl import rewards

        arguments = trl_reward_factory_arguments(algorithm_name, spec)
        return getattr(rewards, spec) if arguments is None else getattr(rewards, spec)(**arguments)
    return load_code(spec)


USER_MODULE_PREFIX = "rlhf_recipe_code_"  # no installed module starts with it: a user's json.py stays theirs


def user_module_name(path: Path) -> str:
    """The module name a recipe's file.py is imported under: one per file (its resolved path), never a name that
    another module answers to (a tool file named json.py must not replace the standard json)."""
    import hashlib

    resolved = path.resolve()
    stem = "".join(char if char.isalnum() else "_" for char in resolved.stem)
    return f"{USER_MODULE_PREFIX}{stem}_{hashlib.sha256(str(resolved).encode()).hexdigest()[:12]}"


def load_code(spec: str) -> Any:
    """What `module:name` or `path/to/file.py:name` names (a function, a class). A file is imported once per
    process, so that a tool and a reward from one file share its state. Importing runs the module's code."""
    target, sep, function = spec.rpartition(":")
    if not sep:
        target, _, function = spec.rpartition(".")
    module = _user_module(Path(target).resolve()) if target.endswith(".py") else importlib.import_module(target)
    return getattr(module, function)


@functools.cache
def _user_module(path: Path) -> ModuleType:
    """A user's file, imported once per process (a failed import is not cached: the next call tries again). It is
    registered under its own name while its code runs, as an import would, so that its classes pickle."""
    name = user_module_name(path)
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]  # a module that failed to import is not kept half-built
        raise
    return module


def reward_functions(inputs: RankInputs) -> list[Callable]:
    """The recipe's Python reward functions: TRL's by name, or module:function / file.py:function."""
    return [load_reward_function(inputs.algorithm, spec) for spec in inputs.script_value("reward_funcs") or []]


def reward_funcs(inputs: RankInputs) -> list[Any]:
    """TRL's `reward_funcs`: the reward model's path (loaded as a sequence classifier), then the functions."""
    model = inputs.script_value("reward_model_name_or_path")
    return ([model] if model else []) + reward_functions(inputs)


def agent_arguments(inputs: RankInputs) -> dict[str, Any]:
    """GRPOTrainer's `tools`, `environment_factory` and `rollout_func` as the recipe names them, imported, each
    tool call limited to `tool_timeout`; only those it sets, so that other trainers' builders and recipes without
    tools pass nothing new."""
    from rlhf_cli.rank.agent_tools import timed_environment, timed_tool

    if not algorithm(inputs.algorithm).takes_tools:
        return {}
    seconds = inputs.script_value("tool_timeout")
    arguments: dict[str, Any] = {}
    if inputs.script_value("tools"):
        arguments["tools"] = [timed_tool(load_code(spec), seconds) for spec in inputs.script_value("tools")]
    factory = inputs.script_value("environment_factory")
    if factory:
        arguments["environment_factory"] = \
            {name: timed_environment(load_code(spec), seconds) for name, spec in factory.items()} \
            if isinstance(factory, dict) else timed_environment(load_code(factory), seconds)
    if inputs.script_value("rollout_func"):
        arguments["rollout_func"] = load_code(inputs.script_value("rollout_func"))
    return arguments
