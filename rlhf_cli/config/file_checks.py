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
from rlhf_cli.generation.engines import ENGINES
from rlhf_cli.models.hub import CONFIG_FILE, local_config
from rlhf_cli.output.checkpoints import deepspeed_shards, deepspeed_tag, saved_by
from rlhf_cli.output.files import read_json
from rlhf_cli.output.run_dir import TRAINER_STATE

WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")
# The tools the ranks find on PATH: DeepSpeed builds its ops with ninja and a C++ compiler.
RANK_TOOLS = ("ninja", "c++")
PRIVILEGED_PORTS = 1024
# Directories, made if missing: the caches, and where torch builds DeepSpeed's ops.
CACHE_VARIABLES = ("HF_HOME", "HF_HUB_CACHE", "HF_DATASETS_CACHE", "TRITON_CACHE_DIR", "TORCH_EXTENSIONS_DIR")
# Whole numbers of GiB a library reads with int() on every rank, and dies of otherwise: the engines' CPU settings.
COUNT_VARIABLES = tuple(name for spec in ENGINES.values() for name in spec.cpu_environment)
# A model's sizes that a checkpoint of it shares (config.json, GPT-2's names second).
SHAPE = (("hidden_size", "n_embd"), ("num_hidden_layers", "n_layer"), ("vocab_size",), ("intermediate_size",))
TIED_HEAD = "lm_head.weight"  # absent from a save where it is tied to the input embedding


def safetensors_header(path: Path) -> tuple[dict[str, Any] | None, int]:
    """(header, header length) of a .safetensors file, (None, -1) when it has none: the first 8 bytes give the
    length of the JSON header that follows (every tensor's dtype, shape and offsets)."""
    try:
        size = path.stat().st_size
        with path.open("rb") as handle:
            length = int.from_bytes(handle.read(8), "little") if size >= 8 else -1
            header = json.loads(handle.read(length)) if 0 <= length <= size - 8 else None
    except (OSError, ValueError, UnicodeDecodeError):
        return None, -1
    return (header, length) if isinstance(header, dict) else (None, -1)


def safetensors_problem(path: Path) -> str | None:
    """Why a .safetensors file cannot be whole, from its header alone: the data it declares must all be there."""
    header, length = safetensors_header(path)
    size = path.stat().st_size if path.exists() else 0
    if header is None:
        return f"{path} is truncated or not a safetensors file ({size} bytes)"
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
        index = read_json(directory / present[0])
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


def checkpoint_problem(checkpoint: Path, use_peft: bool, model: Any, algorithm: str, deepspeed: bool) -> str | None:
    """A checkpoint the trainer can resume this run from: a trainer's save whose state reads, of this run's kind
    and model, with DeepSpeed's shards of every rank that saved it when the run uses DeepSpeed (and none else)."""
    if path_state(checkpoint / TRAINER_STATE).kind != "file":
        return f"{checkpoint} is not a trainer checkpoint (no {TRAINER_STATE}); pass a checkpoint-N directory"
    if not isinstance(read_json(checkpoint / TRAINER_STATE), dict):
        return f"{checkpoint / TRAINER_STATE} is not valid JSON (damaged); pass an earlier checkpoint"
    adapter = path_state(checkpoint / "adapter_config.json").kind == "file"
    if adapter and not use_peft:
        return f"{checkpoint} holds LoRA adapters and this run fine-tunes the whole model; add --lora, or resume a " \
               "full checkpoint"
    if use_peft and not adapter and path_state(checkpoint / CONFIG_FILE).kind == "file":
        return f"{checkpoint} holds a fully fine-tuned model and this run trains LoRA adapters; drop --lora, or " \
               "resume a LoRA checkpoint"
    wrote = _saving_algorithm(checkpoint)
    if wrote is not None and wrote != algorithm:
        return f"{checkpoint} is a checkpoint of an `rlhf {wrote.replace('_', '-')}` run, not of " \
               f"{algorithm.replace('_', '-')}; resume it with `rlhf {wrote.replace('_', '-')}`"
    return _shape_problem(checkpoint, model) or _deepspeed_problem(checkpoint, deepspeed)


LORA_KEYS = {"lora_r": "r", "lora_alpha": "lora_alpha", "lora_target_modules": "target_modules"}  # ours: PEFT's


def adapter_problem(checkpoint: Path, lora: dict[str, Any]) -> str | None:
    """A LoRA checkpoint resumed with another rank, alpha or target modules than it was trained with (its
    `adapter_config.json`): its tensors would not fit this run's adapters (the ranks die on a shape mismatch after
    loading), or would fit and train another model than the one asked for. `lora`: this run's keys (ours); a key
    left to PEFT's default (targets unset, `all-linear`) is not compared."""
    path = checkpoint / "adapter_config.json"
    if path_state(path).kind != "file":
        return None
    saved = read_json(path)
    if not isinstance(saved, dict):
        return f"{path} is not a JSON object (damaged); pass an earlier checkpoint"
    for key, peft_key in LORA_KEYS.items():
        ours, theirs = lora.get(key), saved.get(peft_key)
        if ours is None or ours == "all-linear" or theirs is None:
            continue
        same = sorted(map(str, ours)) == sorted(map(str, theirs)) if isinstance(ours, list) and \
            isinstance(theirs, list) else ours == theirs
        if not same:
            return f"{checkpoint} was trained with {peft_key} {theirs!r} and this run sets `{key}` {ours!r}; set " \
                   f"`{key}: {json.dumps(theirs)}` to resume it, or start a new run"
    return None


def _saving_algorithm(checkpoint: Path) -> str | None:
    """The algorithm of the run that saved `checkpoint`: its manifest says (a copy out of its run dir too), else
    the resolved recipe of the run dir it is in."""
    recorded = saved_by(checkpoint)
    if recorded is not None:
        return recorded.algorithm
    header = _first_line(checkpoint.parent / "recipe.yaml")
    marker = "a valid recipe for `rlhf "
    return header.split(marker, 1)[1].split("`", 1)[0].replace("-", "_") if marker in header else None


def _first_line(path: Path) -> str:
    try:
        with path.open(encoding="utf-8", errors="replace") as handle:
            return handle.readline()
    except OSError:
        return ""


def _deepspeed_problem(checkpoint: Path, deepspeed: bool) -> str | None:
    """DeepSpeed resumes from its own shards, one model and one optimizer file per rank that saved; a checkpoint
    saved without DeepSpeed has none, and a run without DeepSpeed would silently skip its optimizer states."""
    tag = deepspeed_tag(checkpoint)
    if not deepspeed:
        return None if tag is None else f"{checkpoint} was saved under DeepSpeed and this run does not use it; " \
                                        "resume it under DeepSpeed (the accelerate config it was trained with)"
    if tag is None:
        return f"{checkpoint} has no DeepSpeed state (no `latest` naming its global_stepN/ shards): saved without " \
               "DeepSpeed, or copied without them; copy the whole checkpoint, or resume it without DeepSpeed"
    shards = deepspeed_shards(checkpoint, tag)
    ranks = set(range(max(shards["model"] | shards["optim"], default=-1) + 1)) or {0}
    for kind, found in shards.items():
        if found != ranks:
            missing = ", ".join(map(str, sorted(ranks - found)))
            return f"{checkpoint / tag} lacks the DeepSpeed {kind} shards of rank {missing} (of {len(ranks)}); " \
                   "copy the whole checkpoint, or pass an earlier one"
    return None


def _parameter_shapes(directory: Path) -> dict[str, list[int]] | None:
    """Every tensor's shape, from the safetensors headers of a model directory (one file or an index's shards);
    None when its weights are not safetensors."""
    index = read_json(directory / "model.safetensors.index.json")
    files = sorted(set(index["weight_map"].values())) if isinstance(index, dict) and isinstance(
        index.get("weight_map"), dict) else ["model.safetensors"]
    shapes: dict[str, list[int]] = {}
    for name in files:
        header, _ = safetensors_header(directory / name) if path_state(directory / name).kind == "file" else (None, 0)
        if header is None:
            return None
        shapes.update({key: entry.get("shape") for key, entry in header.items()
                       if key != "__metadata__" and isinstance(entry, dict)})
    return shapes


def _shape_problem(checkpoint: Path, model: Any) -> str | None:
    """A checkpoint of the policy: every parameter the same shape (the embedding and output rows may grow, for a
    pad token the run added), read from both safetensors headers; without them, the sizes in config.json."""
    if not (isinstance(model, str) and Path(model).is_absolute()):
        return None
    saved, current = _parameter_shapes(checkpoint), _parameter_shapes(Path(model))
    if saved is None or current is None:
        return _size_problem(checkpoint, model)
    vocab = local_config(model).get("vocab_size")
    for name in sorted(saved.keys() | current.keys()):
        if name == TIED_HEAD and (name not in saved or name not in current):
            continue  # saved once with the embedding it is tied to
        if name not in saved or name not in current:
            where, other = ("the checkpoint", f"the policy {model}") if name in saved else \
                (f"the policy {model}", "the checkpoint")
            return f"{checkpoint} is of another model: {where} has a parameter {name} and {other} none; resume a " \
                   "checkpoint of this model"
        grown = saved[name][1:] == current[name][1:] and current[name][:1] == [vocab] and saved[name][0] >= vocab
        if saved[name] != current[name] and not grown:
            return f"{checkpoint} is of another model: {name} is {saved[name]} there and {current[name]} in the " \
                   f"policy {model}; resume a checkpoint of this model"
    return None


def _size_problem(checkpoint: Path, model: str) -> str | None:
    saved, current = local_config(checkpoint), local_config(model)
    if not saved or not current:
        return None
    for names in SHAPE:
        key = next((key for key in names if key in saved and key in current), None)
        if key is not None and saved[key] != current[key]:
            return f"{checkpoint} is of a model with {key} {saved[key]}, the policy {model} has {current[key]}; " \
                   "resume a checkpoint of this model"
    return None


def run_problems(run: RunValues, cuda: bool, environ: Mapping[str, str]) -> list[str]:
    """Every problem of this module in a resolved run but the checkpoint's (rlhf_cli/config/resume.py), for keys
    whose given value was not refused already."""
    problems = []
    for name in ("model_name_or_path", "reward_model_name_or_path", "value_model_name_or_path", "reward_model_path"):
        path = run.value(name)
        if isinstance(path, str) and path_state(Path(path) / CONFIG_FILE).kind == "file":
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
    return [problem for problem in problems if problem]


class RunValues(Protocol):
    """What the checks read of a run being resolved: a key's value (None where absent or refused) and where it
    was set."""

    algorithm: str

    def value(self, name: str) -> Any: ...

    def where(self, name: str) -> str: ...
