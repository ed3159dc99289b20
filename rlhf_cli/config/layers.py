"""The layers of a run, in precedence order: the recipe, then a scheduler's environment, then the command line.

Each key is mapped to today's field (renamed, aliased, or refused with why), typed, located, and recorded with the
place that set it; a key set twice in one layer is a problem, a later layer beats an earlier one.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from rlhf_cli.algorithms import ALGORITHMS, algorithm
from rlhf_cli.config.cluster import detect_layout
from rlhf_cli.config.draft import Draft, suggest
from rlhf_cli.config.fields import ALIASES, Field, FieldTypeError, catalogue, coerce, snapshot_list
from rlhf_cli.config.locate import locate
from rlhf_cli.config.recipe import Recipe
from rlhf_cli.config.run import Setting

# The flag that sets each key the environment may fill in.
_FLAG_NAMES = {"num_machines": "--num-machines", "machine_rank": "--machine-rank",
               "main_process_ip": "--main-process-ip", "main_process_port": "--main-process-port",
               "num_processes": "--num-processes"}
SFT_MODEL_PATH_MEANING = (
    "in TRL 0.14's PPO `sft_model_path` was the policy and reference and `model_name_or_path` only the tokenizer; "
    "rlhf loads all three from `model_name_or_path`: give it the SFT model (with its tokenizer) and drop the other")
# What the `accelerate launch` options pasted lines carry most do, for the line that refuses them as flags
LAUNCH_OPTION_MEANINGS = {
    "rdzv_backend": "how the machines of a job meet: static, c10d or etcd",
    "mixed_precision": "the autocast dtype; the recipe's bf16/fp16 keys set the trainer's",
    "use_deepspeed": "run under DeepSpeed, which rlhf always does",
    "multi_gpu": "one process per GPU, which rlhf's num_processes sets",
    "gpu_ids": "which GPUs the processes use; CUDA_VISIBLE_DEVICES does the same",
    "same_network": "whether the machines share a network",
    "deepspeed_config_file": "a DeepSpeed JSON config instead of accelerate's keys",
    "zero_stage": "the ZeRO stage; rlhf runs stage 3",
    "dynamo_backend": "torch.compile's backend",
    "num_cpu_threads_per_process": "OMP threads per process",
    "max_restarts": "how often torch's launcher restarts failed ranks",
}
DEEPSPEED_SECTION_OPTIONS = ("zero_stage", "deepspeed_config_file", "offload_optimizer_device", "offload_param_device",
                             "zero3_init_flag", "zero3_save_16bit_model", "gradient_clipping",
                             "deepspeed_multinode_launcher", "deepspeed_hostfile")


def canonical(draft: Draft, key: str, where: str) -> str | None:
    """Today's field for `key`, or None after recording why it cannot be used."""
    entry = algorithm(draft.request.algorithm)
    if key in entry.renamed:  # also a key TRL declares but never reads
        today = entry.renamed[key]
        draft.notes.append(f"{where}: `{key}` is the old name of `{today}`; using it as `{today}`")
        return today
    if key in ALIASES:
        return ALIASES[key]
    if key in draft.fields:
        return key
    owners = [other.command for other in ALGORITHMS.values() if key in catalogue(other.name)]
    if key in entry.retired:
        of = f" (a {' and '.join(owners)} key)" if owners else ""
        draft.problems.append(f"{where}: `{key}`{of} has no counterpart in today's {entry.command}: "
                              f"{entry.retired[key]}")
        return None
    if owners:
        draft.problems.append(f"{where}: `{key}` is a {' and '.join(owners)} key, not one of {entry.command}; "
                              f"remove it or run `rlhf {owners[0]}`")
        return None
    if key in snapshot_list(draft.request.algorithm, "accelerate_launch_options"):
        meaning = f" ({LAUNCH_OPTION_MEANINGS[key]})" if key in LAUNCH_OPTION_MEANINGS else ""
        section = "under `deepspeed_config:` " if key in DEEPSPEED_SECTION_OPTIONS else ""
        draft.problems.append(f"{where}: `{key}`{meaning} is an option of `accelerate launch`, which rlhf starts "
                              f"from an accelerate config file: write `{key}: VALUE` {section}in a copy of "
                              "accelerate_configs/deepspeed_zero3.yaml and give it with --accelerate-config (or "
                              "--config_file)")
        return None
    names = sorted(set(draft.fields) | set(ALIASES))
    options = f" (nor an option: see `rlhf {entry.command} --help`)" if where == f"--{key}" else ""
    draft.problems.append(f"{where}: unknown key `{key}`{suggest(key, names)}{options}")
    return None


def put(draft: Draft, key: str, raw: Any, source: str, where: str, base_dirs: tuple[Path, ...]) -> None:
    """Set one key from one layer (the recipe, or the command line); later layers win."""
    name = canonical(draft, key, where)
    if name is None:
        return
    layer = "recipe" if source == "recipe" else "command line"
    if name in draft.layers and draft.layers[name][0] == layer:
        if _same_value(draft, name, raw, where, base_dirs):
            return  # TRL 0.x's command lines give model_name_or_path and sft_model_path alike: one value
        what = f"`{name}` is set" if key == name else f"`{key}` sets `{name}`"
        why = SFT_MODEL_PATH_MEANING if "sft_model_path" in (key, draft.layers[name][2]) else "keep one"
        draft.problems.append(f"{where}: {what} again (already set by {draft.layers[name][1]}); {why}")
        return
    draft.layers[name] = (layer, where, key)
    try:
        value = coerce(draft.fields[name], raw)
    except FieldTypeError as error:
        draft.problems.append(f"{where}: `{key}`: {error}")
        draft.refused.add(name)
        draft.settings.pop(name, None)  # an earlier layer's value is not the one asked for either
        return
    draft.refused.discard(name)
    found = len(draft.problems)
    draft.settings[name] = Setting(locate(draft, draft.fields[name], value, where, base_dirs), source)
    if len(draft.problems) > found:  # a path not found, a bad entry: later checks must not judge it again
        draft.refused.add(name)


def _same_value(draft: Draft, name: str, raw: Any, where: str, base_dirs: tuple[Path, ...]) -> bool:
    """Whether `raw` is the value `name` already has (a path the same file), judged without a word."""
    if name not in draft.settings:
        return False
    problems, notes = list(draft.problems), list(draft.notes)
    try:
        value = locate(draft, draft.fields[name], coerce(draft.fields[name], raw), where, base_dirs)
    except FieldTypeError:
        value = None
    finally:
        draft.problems[:], draft.notes[:] = problems, notes
    return value is not None and value == draft.settings[name].value


def apply_recipe(draft: Draft, recipe: Recipe) -> None:
    draft.recipe_path = recipe.path
    bases = (recipe.path.parent, draft.cwd)
    draft.problems.extend(recipe.problems)
    draft.notes.extend(recipe.notes)
    for key, value in recipe.values.items():
        put(draft, key, value, "recipe", recipe.where(key), bases)


def apply_environment(draft: Draft, environ: Mapping[str, str]) -> None:
    """A scheduler's layout (SLURM, torchrun-style) beats the recipe's; flags still beat it."""
    layout = detect_layout(environ)
    given = _keys_on_command_line(draft)
    for name, variable, why in layout.malformed:
        if name not in given:
            draft.problems.append(f"{variable}={environ[variable]!r}: {why}; fix the job's variables or pass "
                                  f"{_FLAG_NAMES[name]}")
            draft.refused.add(name)
    for name, (text, variable) in layout.values.items():
        if name in given:
            continue  # the flag beats the variable, whatever it holds
        try:
            draft.settings[name] = Setting(coerce(draft.fields[name], text), f"env {variable}")
        except FieldTypeError as error:
            draft.problems.append(f"{variable}={text}: `{name}`: {error}; fix the job's variables or pass "
                                  f"{_FLAG_NAMES[name]}")
            draft.refused.add(name)
    draft.notes.extend(layout.notes)


def _keys_on_command_line(draft: Draft) -> set[str]:
    """The keys a flag, a TRL-style flag or --set gives (as typed: a renamed key counts as its old name)."""
    request = draft.request
    return {*request.flags, *(flag[2:].replace("-", "_") for flag, _ in request.trl_flags),
            *(pair.partition("=")[0].strip() for pair in request.sets)}


def apply_command_line(draft: Draft) -> None:
    bases = (draft.cwd,)
    for name, (flag, value) in draft.request.flags.items():
        put(draft, name, value, f"flag {flag}", flag, bases)
    for flag, words in draft.request.trl_flags:  # TRL's spelling: `--learning_rate 1e-6`, `--use_vllm`
        key, value = _trl_flag_value(draft, flag, words)
        if value is not _INVALID:
            put(draft, key, value, f"flag {flag}", flag, bases)
    for pair in draft.request.sets:
        key, sep, text = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            draft.problems.append(f"--set {pair}: expected KEY=VALUE")
            continue
        value = _yaml_value(draft, f"--set {key}", text, f"--set \"{key}='{text}'\"")
        if value is not _INVALID:
            put(draft, key, value, "--set", f"--set {key}", bases)


_INVALID = object()  # a command-line value that is not YAML (already reported)
TRUE_WORDS, FALSE_WORDS = ("yes", "true", "t", "y", "1"), ("no", "false", "f", "n", "0")  # transformers' string_to_bool


def _trl_flag_value(draft: Draft, flag: str, words: tuple[str, ...]) -> tuple[str, Any]:
    """(key, value) of a TRL-style flag, read as TRL's HfArgumentParser reads it from the field's type: `--no_X` is
    X false for a bool that defaults to true, a bool takes yes/no/true/false/1/0 (alone: true), a text field the
    word as typed (a bare `no` is the choice, not YAML's false), `none` an optional number's null, a list every
    word; anything else is read as YAML, as in a recipe."""
    key = flag[2:].replace("-", "_")
    field = draft.fields.get(key)
    negated = draft.fields.get(key[3:]) if key.startswith("no_") and field is None else None
    if negated is not None and negated.default is True and "bool" in negated.kinds and not words:
        return negated.name, False
    if not words:
        return key, True
    if field is not None and "list" in field.kinds:
        items = [_trl_word(draft, field, flag, word) for word in words]
        return key, _INVALID if _INVALID in items else items
    return key, _trl_word(draft, field, flag, words[0])


def _trl_word(draft: Draft, field: Field | None, flag: str, word: str) -> Any:
    kinds = field.kinds if field is not None else ()
    if "bool" in kinds and word.lower() in TRUE_WORDS + FALSE_WORDS:
        return word.lower() in TRUE_WORDS
    if "str" in kinds:
        return word
    if "null" in kinds and word.lower() in ("none", "null"):
        return None
    value = _yaml_value(draft, flag, word, f"{flag}='{word}'")
    return word if "list" in kinds and isinstance(value, bool) else value


def _yaml_value(draft: Draft, where: str, text: str, quoted: str) -> Any:
    """A command-line value read as a YAML scalar, as the recipe would hold it; _INVALID after reporting why not."""
    try:
        return yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError as error:
        problem = getattr(error, "problem", None) or "not valid YAML"
        draft.problems.append(f"{where}: {text!r} is not valid YAML ({problem}); to give it as text, quote it: "
                              f"{quoted}")
        return _INVALID
