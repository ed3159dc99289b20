"""What every rank would die of after loading for a minute, found before anything starts: model directories
without weights or a tokenizer, truncated weights, a checkpoint that is not one of this run, a missing vLLM,
reward weights that do not match the rewards, and `env:` values that break the ranks' machine. Reads files and
headers only; imports nothing heavy.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from rlhf_cli.config.paths import path_state

WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")
# The tools the ranks find on PATH: DeepSpeed builds its ops with ninja and a C++ compiler.
RANK_TOOLS = ("ninja", "c++")
PRIVILEGED_PORTS = 1024
# Directories, made if missing: the caches, and where torch builds DeepSpeed's ops.
CACHE_VARIABLES = ("HF_HOME", "HF_HUB_CACHE", "HF_DATASETS_CACHE", "TRITON_CACHE_DIR", "TORCH_EXTENSIONS_DIR")
# Whole numbers of GiB a library reads with int() on every rank, and dies of otherwise.
COUNT_VARIABLES = ("VLLM_CPU_KVCACHE_SPACE",)
# A model's sizes that a checkpoint of it shares (config.json, GPT-2's names second).
SHAPE = (("hidden_size", "n_embd"), ("num_hidden_layers", "n_layer"), ("vocab_size",), ("intermediate_size",))


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def safetensors_problem(path: Path) -> str | None:
    """Why a .safetensors file cannot be whole, from its header alone: the data it declares must all be there."""
    try:
        size = path.stat().st_size
        with path.open("rb") as handle:
            length = int.from_bytes(handle.read(8), "little") if size >= 8 else -1
            header = json.loads(handle.read(length)) if 0 <= length <= size - 8 else None
    except (OSError, ValueError, UnicodeDecodeError):
        header = None
    if not isinstance(header, dict):
        return f"{path} is truncated or not a safetensors file ({size if path.exists() else 0} bytes)"
    ends = [entry["data_offsets"][1] for name, entry in header.items() if name != "__metadata__"
            and isinstance(entry, dict) and isinstance(entry.get("data_offsets"), list) and entry["data_offsets"]]
    needed = 8 + length + max(ends, default=0)
    return f"{path} is truncated ({size} of {needed} bytes)" if size < needed else None


def weights_problem(directory: Path) -> str | None:
    """Why a model directory's weights cannot be loaded, or None."""
    present = [name for name in WEIGHTS if path_state(directory / name).kind == "file"]
    if not present:
        return f"{directory} has no weights ({' or '.join(WEIGHTS[::2])})"
    if present[0] == "model.safetensors":
        return safetensors_problem(directory / "model.safetensors")
    if present[0].endswith(".index.json"):
        index = _json(directory / present[0])
        shards = sorted(set(index["weight_map"].values())) if isinstance(index, dict) and isinstance(
            index.get("weight_map"), dict) else None
        if shards is None:
            return f"{directory / present[0]} is not a weight index (no weight_map)"
        for shard in shards:
            if path_state(directory / shard).kind != "file":
                return f"{directory / shard} is missing (listed in {present[0]})"
            if shard.endswith(".safetensors") and (problem := safetensors_problem(directory / shard)):
                return problem
    return None


def model_files_problem(directory: Path, needs_tokenizer: bool) -> str | None:
    """A local model directory the ranks load: weights whole, and a tokenizer when the run reads one from it."""
    problem = weights_problem(directory)
    if problem is None and needs_tokenizer and not any(path_state(directory / name).kind == "file"
                                                       for name in TOKENIZER_FILES):
        problem = f"{directory} has no tokenizer ({', '.join(TOKENIZER_FILES[:3])}, ...)"
    return problem


def reward_weights_problem(weights: list[Any], rewards: int, where: str) -> str | None:
    """TRL weighs each reward (the reward model first, then each function) by one number."""
    wrong = next((weight for weight in weights if isinstance(weight, bool) or not isinstance(weight, (int, float))),
                 None)
    if wrong is not None:
        return f"{where}: `reward_weights`: {wrong!r} is not a number; give one number per reward"
    if len(weights) != rewards:
        return (f"{where}: `reward_weights` has {len(weights)} weights and the run {rewards} rewards (the reward "
                "model, then each of reward_funcs); give one number per reward, or drop the key")
    return None


def environment_problems(env: dict[str, str], where: str, cuda: bool) -> list[str]:
    """The recipe's `env:` reaches every rank: it must not hide the ranks' tools or point at what cannot work."""
    problems = []
    if "PATH" in env:
        lost = [tool for tool in RANK_TOOLS if shutil.which(tool) and not shutil.which(tool, path=env["PATH"])]
        if lost:
            places = ", ".join(sorted({str(Path(shutil.which(tool) or "").parent) for tool in lost}))
            problems.append(f"{where}: `env.PATH` hides {' and '.join(lost)} ({places}), which DeepSpeed builds its "
                            f"ops with; keep {places} in it")
    if env.get("DS_ACCELERATOR") == "cuda" and not cuda:
        problems.append(f"{where}: `env.DS_ACCELERATOR` is cuda and this machine has no CUDA; remove it (rlhf "
                        "chooses cpu here)")
    port = env.get("MASTER_PORT")
    if port is not None and (not port.isdigit() or not PRIVILEGED_PORTS <= int(port) <= 65535):
        problems.append(f"{where}: `env.MASTER_PORT` {port!r}: the rendezvous needs a port from {PRIVILEGED_PORTS} "
                        "to 65535 (lower ones are privileged); set --main-process-port instead")
    return problems + _variable_problems(env, f"{where}: `env.{{name}}` {{value}}")


def _variable_problems(env: Mapping[str, str], label: str) -> list[str]:
    """Directories and counts the ranks' libraries read from the environment."""
    problems = [problem for name in CACHE_VARIABLES if (problem := _cache_dir_problem(env, name, label))]
    for name in COUNT_VARIABLES:
        value = env.get(name)
        if value is not None and not value.strip().isdigit():
            problems.append(f"{label.format(name=name, value=repr(value))} is not a whole number (GiB); set it "
                            "to one, like 4")
    return problems


def _cache_dir_problem(env: Mapping[str, str], name: str, label: str) -> str | None:
    value = env.get(name)
    if value is None or path_state(Path(value).expanduser()).kind in ("dir", "missing"):
        return None
    return f"{label.format(name=name, value=value)} is not a directory; point it at a directory (made if missing)"


def environ_problems(environ: Mapping[str, str]) -> list[str]:
    """The caller's own variables, which the ranks inherit, where they break every rank."""
    return _variable_problems(environ, "{name}={value}")


def checkpoint_problem(checkpoint: Path, use_peft: bool, model: Any, algorithm: str) -> str | None:
    """A checkpoint the trainer can resume this run from: a trainer's save, of this run's kind and model."""
    if path_state(checkpoint / "trainer_state.json").kind != "file":
        return f"{checkpoint} is not a trainer checkpoint (no trainer_state.json); pass a checkpoint-N directory"
    adapter = path_state(checkpoint / "adapter_config.json").kind == "file"
    if adapter and not use_peft:
        return f"{checkpoint} holds LoRA adapters and this run fine-tunes the whole model; add --lora, or resume a " \
               "full checkpoint"
    if use_peft and not adapter and path_state(checkpoint / "config.json").kind == "file":
        return f"{checkpoint} holds a fully fine-tuned model and this run trains LoRA adapters; drop --lora, or " \
               "resume a LoRA checkpoint"
    header = _first_line(checkpoint.parent / "recipe.yaml")  # the run that wrote it: its resolved recipe says
    marker = "a valid recipe for `rlhf "
    if marker in header:
        wrote = header.split(marker, 1)[1].split("`", 1)[0].replace("-", "_")
        if wrote != algorithm:
            return f"{checkpoint} is a checkpoint of an `rlhf {wrote.replace('_', '-')}` run, not of " \
                   f"{algorithm.replace('_', '-')}; resume it with `rlhf {wrote.replace('_', '-')}`"
    return _shape_problem(checkpoint, model)


def _first_line(path: Path) -> str:
    try:
        with path.open(encoding="utf-8", errors="replace") as handle:
            return handle.readline()
    except OSError:
        return ""


def _shape_problem(checkpoint: Path, model: Any) -> str | None:
    saved = _json(checkpoint / "config.json")
    current = _json(Path(model) / "config.json") if isinstance(model, str) and Path(model).is_absolute() else None
    if not isinstance(saved, dict) or not isinstance(current, dict):
        return None
    for names in SHAPE:
        key = next((key for key in names if key in saved and key in current), None)
        if key is not None and saved[key] != current[key]:
            return f"{checkpoint} is of a model with {key} {saved[key]}, the policy {model} has {current[key]}; " \
                   "resume a checkpoint of this model"
    return None


def run_problems(run: RunValues, cuda: bool, environ: Mapping[str, str]) -> list[str]:
    """Every problem of this module in a resolved run, for keys whose given value was not refused already."""
    problems = []
    for name in ("model_name_or_path", "reward_model_name_or_path", "value_model_name_or_path", "reward_model_path"):
        path = run.value(name)
        if isinstance(path, str) and path_state(Path(path) / "config.json").kind == "file":
            problem = model_files_problem(Path(path), needs_tokenizer=name != "value_model_name_or_path")
            problems += [f"{run.where(name)}: `{name}`: {problem}; save the model again"] if problem else []
    weights = run.value("reward_weights")
    if isinstance(weights, list):
        rewards = int(bool(run.value("reward_model_name_or_path"))) + len(run.value("reward_funcs") or [])
        problems.append(reward_weights_problem(weights, rewards, run.where("reward_weights")) or "")
    env = run.value("env")
    if isinstance(env, dict):
        problems += environment_problems(env, run.where("env"), cuda)
    problems += environ_problems(environ)
    checkpoint = run.value("resume_from_checkpoint")
    if isinstance(checkpoint, str) and Path(checkpoint).is_absolute():
        problem = checkpoint_problem(Path(checkpoint), run.value("use_peft") is True, run.value("model_name_or_path"),
                                     run.algorithm)
        problems += [f"--resume {checkpoint}: {problem}"] if problem else []
    return [problem for problem in problems if problem]


class RunValues(Protocol):
    """What the checks read of a run being resolved: a key's value (None where absent or refused) and where it
    was set."""

    algorithm: str

    def value(self, name: str) -> Any: ...

    def where(self, name: str) -> str: ...
