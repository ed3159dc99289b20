"""Checks of the whole run, once every layer is in: what is required, what must agree, what must exist.

Each adds its problems (or notes) to the draft; none stops at the first, so the user sees every problem at once.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rlhf_cli.algorithms import algorithm
from rlhf_cli.config.accelerate import is_zero3, zero_stage
from rlhf_cli.config.agent_code import own_data_problem
from rlhf_cli.config.data_files import READERS, DataFileError, check_prompts
from rlhf_cli.config.draft import Draft, Refused
from rlhf_cli.config.engines import config_room, engine_problems, length_problems
from rlhf_cli.config.key_rules import check_model_config, check_reward_model, cross_field_problems
from rlhf_cli.config.locate import DATA_BUILDERS, MODEL_FIELDS
from rlhf_cli.config.lora import lora_problems
from rlhf_cli.config.output_dir import Input, OutputDirCheck
from rlhf_cli.config.paths import path_state, writable_dir_problem
from rlhf_cli.config.run import Setting
from rlhf_cli.generation.budget import BudgetError, parse_budget
from rlhf_cli.generation.choice import Engine
from rlhf_cli.machine.gpus import GPUS, HardwareError, from_file, named, with_interconnect, with_network
from rlhf_cli.sizes import SizeError, parse_size

# The trainers' collective timeout, unless the recipe sets one: a backstop for what the stall watch does not judge
# (a rank hung while loading or saving), long enough for the saves and loads that make the others wait.
COLLECTIVE_TIMEOUT_FACTOR = 5


def check_required(draft: Draft) -> None:
    """A policy, a dataset and a reward; GRPO's environment may own the data and the reward, as TRL lets it (the
    pre-launch check finds whether it has get_reward)."""
    if "model_name_or_path" not in draft.settings:
        draft.problems.append("no policy model: set `model_name_or_path` in the recipe or pass --model")
    environment = draft.value("environment_factory") if "environment_factory" in draft.fields else None
    if "dataset_name" not in draft.settings and not draft.value("datasets") and "datasets" not in draft.refused:
        problem = own_data_problem(environment, draft.value("max_steps")) if environment else \
            "no dataset: set `dataset_name` in the recipe or pass --dataset"
        draft.problems += [problem] if problem else []
    if not draft.value("reward_model_name_or_path") and not draft.value("reward_funcs") and not environment:
        draft.problems.append(
             "no reward: set `reward_model_name_or_path` (or --reward-model) and/or `reward_funcs`")


def settle_gather_budget(draft: Draft) -> None:
    """`gather_budget` and `gather` say one thing: a budget of the whole policy is gather, any other no-gather
    (TRL's path; the ranks gather the budget's part themselves). When both are set, the command line beats
    the recipe; set in one place, they must agree (`--gather` is the budget 1, `--no-gather` the budget 0)."""
    setting = draft.settings.get("gather_budget")
    if setting is None or setting.value is None:
        return
    where = draft.layers["gather_budget"][1]
    try:
        budget = parse_budget(setting.value)
    except BudgetError as error:
        draft.problems.append(f"{where}: `gather_budget`: {error}")
        draft.refused.add("gather_budget")
        return
    draft.settings["gather_budget"] = Setting(budget.fraction if budget.fraction is not None else setting.value,
                                              setting.source)
    gather = draft.settings.get("ds3_gather_for_generation")
    agrees = gather is not None and gather.value is (True if budget.whole else False if budget.nothing else None)
    if gather is None or agrees or draft.outranks("gather_budget", "ds3_gather_for_generation"):
        draft.settings["ds3_gather_for_generation"] = Setting(budget.whole, f"gather_budget {budget}")
    elif draft.outranks("ds3_gather_for_generation", "gather_budget"):
        del draft.settings["gather_budget"]
        draft.notes.append(f"{draft.layers['ds3_gather_for_generation'][1]} overrides the recipe's "
                           f"gather_budget {budget}")
    else:
        meaning = {True: "gather: true is the budget 1", False: "gather: false is the budget 0",
                   "auto": "gather: auto lets the plan choose the budget"}[gather.value]
        draft.problems.append(f"{where}: gather_budget {budget} contradicts "
                              f"{draft.layers['ds3_gather_for_generation'][1]} ({meaning}); keep one")


def check_gpu_memory(draft: Draft) -> None:
    if draft.value("gpu_memory") is not None:
        try:
            parse_size(draft.value("gpu_memory"))
        except SizeError as error:
            draft.problems.append(f"{draft.layers['gpu_memory'][1]}: `gpu_memory`: {error}")


def check_hardware(draft: Draft) -> None:
    """`gpu`, `hardware_file`, `interconnect` and `network` as the time plan reads them (rlhf_cli/machine/gpus.py)."""
    gpu = None
    for key, read in (("gpu", named), ("hardware_file", lambda text: from_file(Path(text)))):
        if draft.value(key) is not None:
            try:
                gpu = read(str(draft.value(key)))
            except HardwareError as error:
                draft.problems.append(f"{draft.layers[key][1]}: `{key}`: {error}")
    if draft.value("gpu") is not None and draft.value("hardware_file") is not None:
        draft.problems.append(f"{draft.layers['gpu'][1]}: `gpu` and `hardware_file` both name the GPU; keep one")
    if draft.value("interconnect") is not None:
        try:
            with_interconnect(gpu or GPUS["h100"], str(draft.value("interconnect")))
        except HardwareError as error:  # with no GPU named, nvlink is checked against nvidia-smi's by the plan
            draft.problems.append(f"{draft.layers['interconnect'][1]}: `interconnect`: {error}")
    if draft.value("network") is not None:
        try:
            with_network(GPUS["h100"], str(draft.value("network")))
        except HardwareError as error:
            draft.problems.append(f"{draft.layers['network'][1]}: `network`: {error}")


def check_stall_timeout(draft: Draft) -> None:
    """Its range is in rlhf_cli/schema/ranges.yaml; a collective timeout of the recipe's own may undercut it."""
    timeout = draft.value("stall_timeout")
    if "ddp_timeout" in draft.settings and draft.value("ddp_timeout") <= timeout:
        draft.notes.append(f"warning: ddp_timeout {draft.value('ddp_timeout')} is not above stall_timeout "
                           f"{timeout:g}: a collective may time out before the stall watch names the stalled rank")


def default_output_dir(draft: Draft) -> None:
    if draft.value("output_dir") is None:  # unset, or `output_dir: null`
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = draft.cwd / "runs" / f"{draft.request.algorithm.replace('_', '-')}-{stamp}"
        draft.settings["output_dir"] = Setting(str(path), "default")


def check_output_dir(draft: Draft) -> None:
    """A directory this machine can write (made if missing); machine rank 0's must not hold a run already."""
    if "output_dir" in draft.refused:
        return
    setting = draft.settings["output_dir"]
    flag = draft.layers.get("output_dir", ("", "`output_dir`"))[1]
    problem = writable_dir_problem(Path(setting.value), may_create=True) if setting.value.strip() \
        else "is empty; give a directory"
    if problem:
        draft.problems.append(f"{flag}: output dir {problem}")
        return
    if (draft.value("machine_rank") or 0) > 0 or "resume_from_checkpoint" in draft.refused:
        return  # machine rank 0 owns the output dir; the others join its run
    resume = draft.settings.get("resume_from_checkpoint")
    check = OutputDirCheck(Path(setting.value), flag, draft.request.overwrite, draft.resume_asked)
    draft.problems += check.check(_inputs(draft), resume is not None and resume.value is not None)
    draft.output_dir_entries = check.entries


def _inputs(draft: Draft) -> list[Input]:
    """The local files and directories the run reads, for the output dir to keep clear of."""
    found = [Input("recipe", draft.recipe_path, read_by_ranks=False)] if draft.recipe_path else []
    for name in (*MODEL_FIELDS, "reward_model_path", "dataset_name"):
        value = draft.value(name) if name in draft.fields and name not in draft.refused else None
        if isinstance(value, str) and Path(value).is_absolute():
            found.append(Input(f"`{name}`", Path(value)))
    if "accelerate_config" not in draft.refused and isinstance(draft.value("accelerate_config"), str):
        found.append(Input("`accelerate_config`", Path(draft.value("accelerate_config")), read_by_ranks=False))
    for spec in draft.value("reward_funcs") or [] if "reward_funcs" not in draft.refused else []:
        target = str(spec).rpartition(":")[0]
        if target.endswith(".py") and Path(target).is_absolute():
            found.append(Input("`reward_funcs` file", Path(target)))
    for index, entry in enumerate(draft.value("datasets") or [] if "datasets" not in draft.refused else []):
        if isinstance(entry, dict) and isinstance(entry.get("path"), str) and Path(entry["path"]).is_absolute():
            found.append(Input(f"`datasets[{index}]`", Path(entry["path"])))
        if isinstance(entry, dict):
            found += [Input(f"`datasets[{index}]` file", path) for path in _entry_files(entry)]
    return found


def check_nvme_path(draft: Draft) -> None:
    """DeepSpeed swaps into it: a directory it can write."""
    path = draft.value("nvme_path")
    if path is not None and path_state(Path(path)).kind == "dir":  # else reported as not found
        problem = writable_dir_problem(Path(path), may_create=False)
        if problem:
            draft.problems.append(f"{draft.layers['nvme_path'][1]}: `nvme_path`: {problem}")


def check_nvme_use(draft: Draft, accelerate: dict[str, Any]) -> None:
    """An NVMe directory with nothing offloaded to nvme is never used: refused as a flag (it would change nothing),
    a warning from a recipe (which may keep it for runs that offload)."""
    setting = draft.settings.get("nvme_path")
    deepspeed = accelerate.get("deepspeed_config") or {}
    if setting is None or setting.value is None or "nvme_path" in draft.refused or "deepspeed_config_file" in deepspeed:
        return
    if "nvme" in (deepspeed.get("offload_optimizer_device"), deepspeed.get("offload_param_device")):
        return
    said = (draft.said("nvme_path") or "`nvme_path: {value}`").format(value=setting.value)
    why = "nothing is offloaded to nvme, so it would change nothing; add --offload-optimizer nvme or " \
          "--offload-params nvme"
    if setting.source.startswith("flag "):
        draft.problems.append(f"{said}: {why}, or drop it")
    else:
        draft.notes.append(f"warning: {said}: {why} to use it")


def check_models(draft: Draft) -> None:
    for name in MODEL_FIELDS:
        found = len(draft.problems)
        if name in draft.fields and name not in draft.refused:
            check_model_config(name, draft.value(name), draft.layers.get(name, ("", ""))[1], draft.problems)
        if name == "reward_model_name_or_path" and name not in draft.refused:
            check_reward_model(draft.value(name), draft.problems)
        if len(draft.problems) > found:  # its files are not judged as well
            draft.refused.add(name)


def check_data(draft: Draft) -> None:
    """The first rows of each local prompt file parse and hold the prompt column."""
    column = draft.value("dataset_prompt_column")
    files: list[tuple[str, Path, Any]] = []
    name = draft.value("dataset_name")
    if isinstance(name, str) and Path(name).is_absolute() and Path(name).suffix in READERS:
        files.append((draft.layers["dataset_name"][1], Path(name), None))
    for index, entry in enumerate(draft.value("datasets") or []):
        if isinstance(entry, dict):
            where = f"{draft.layers['datasets'][1]}: `datasets[{index}]`"
            files += [(where, path, entry.get("columns")) for path in _entry_files(entry)]
    for where, path, columns in files:
        if path_state(path).kind == "file":
            try:
                check_prompts(path, column, columns, optional=bool(draft.fields.get("environment_factory")
                                                                    and draft.value("environment_factory")))
            except DataFileError as error:
                draft.problems.append(f"{where}: {error}")


def check_mixture(draft: Draft) -> None:
    """TRL's rules for `fraction` in a dataset mixture, which it checks only while loading, on every rank."""
    entries = [entry for entry in draft.value("datasets") or [] if isinstance(entry, dict)]
    given = [entry.get("fraction") is not None for entry in entries]
    if "datasets" in draft.refused or not any(given):
        return
    where = draft.layers["datasets"][1]
    if not all(given):
        draft.problems.append(f"{where}: `datasets`: `fraction` is set for some datasets of the mixture and not "
                              "for others; set it for all of them or for none")
    elif draft.value("streaming"):
        draft.problems.append(f"{where}: `datasets`: `fraction` cannot be used with `streaming: true` (a stream's "
                              "length is unknown); drop one")


def check_deepspeed_field(draft: Draft, accelerate: dict[str, Any]) -> None:
    """TrainingArguments' own `deepspeed` setting must not contradict the accelerate config rlhf launches with."""
    value = draft.value("deepspeed")
    if value is None or "deepspeed" in draft.refused:
        return
    where = draft.layers["deepspeed"][1]
    stage = _deepspeed_stage(value)
    launched = zero_stage(accelerate)
    if stage is None:
        draft.problems.append(f"{where}: `deepspeed`: not a DeepSpeed config (a JSON file or a mapping with "
                              "zero_optimization.stage); rlhf configures DeepSpeed itself: remove the key")
    elif stage != launched:
        said = f"ZeRO stage {launched}" if launched is not None else "no DeepSpeed"
        draft.problems.append(f"{where}: `deepspeed` asks for ZeRO stage {stage}, the accelerate config for "
                              f"{said}; remove `deepspeed` (rlhf sets DeepSpeed up from the accelerate config "
                              "and the offload flags)")


def _entry_files(entry: dict[str, Any]) -> list[Path]:
    """The local data files of one mixture entry: its path, or its data_files under a json/csv/parquet builder."""
    path = Path(entry["path"])
    if path.is_absolute() and path.suffix in READERS:
        return [path]
    files = entry.get("data_files") if entry["path"] in DATA_BUILDERS else None
    found: list[str] = []
    pending = [files]
    while pending:
        part = pending.pop()
        if isinstance(part, dict):
            pending += list(part.values())
        elif isinstance(part, list):
            pending += part
        elif isinstance(part, str):
            found.append(part)
    return [Path(part) for part in found if Path(part).is_absolute() and Path(part).suffix in READERS]


def _deepspeed_stage(value: Any) -> int | None:
    """The ZeRO stage of TrainingArguments' `deepspeed` value (a path to a JSON file, or a mapping)."""
    if isinstance(value, str):
        try:
            value = json.loads(Path(value).read_text())
        except (OSError, ValueError):
            return None
    stage = value.get("zero_optimization", {}).get("stage", 0) if isinstance(value, dict) else None
    return stage if isinstance(stage, int) else None


QUANTIZATION_KEYS = ("load_in_4bit", "load_in_8bit")  # TRL's ModelConfig: QLoRA through bitsandbytes


def check_cpu_and_lora(draft: Draft, cpu_only: bool) -> None:
    """fp16 or QLoRA without a GPU, and LoRA flags given while LoRA is off: none would do what the user wants."""
    if cpu_only and draft.value("fp16") is True and draft.value("bf16") is not True:  # both: said elsewhere
        said = (draft.said("fp16") or "`fp16: {value}`").format(value="true")
        draft.problems.append(f"{said}: fp16 needs a GPU and this machine has none; set bf16: true (the CPU "
                              "has bf16) or neither")
    for name in QUANTIZATION_KEYS:
        if cpu_only and draft.value(name) is True:
            said = (draft.said(name) or f"`{name}: {{value}}`").format(value="true")
            draft.problems.append(f"{said}: QLoRA quantizes with bitsandbytes, which needs CUDA, and this machine "
                                  f"has none; set {name}: false (LoRA without quantization runs here)")
    if draft.value("use_peft") is True:
        return
    for name, flag in (("lora_r", "--lora-r {value}"), ("merge_adapter", "--merge-adapter")):
        setting = draft.settings.get(name)
        if setting is not None and setting.source.startswith("flag "):
            draft.problems.append(f"{flag.format(value=setting.value)}: LoRA is off (`use_peft` is not true), so "
                                  "it would change nothing; add --lora")
        # merge_adapter is rlhf's own key, so true anywhere asks for something: TRL's recipes set lora_r and the
        # rest alongside use_peft: false, so those stay quiet unless a flag gives them.
        elif name == "merge_adapter" and setting is not None and setting.value is True:
            said = (draft.said(name) or "`merge_adapter: {value}`").format(value="true")
            draft.problems.append(f"{said}: LoRA is off (`use_peft` is not true), so there is no adapter to merge; "
                                  "set use_peft: true (or add --lora), or remove merge_adapter")


def check_across_fields(draft: Draft, accelerate: dict[str, Any], cpu_only: bool) -> None:
    """The rules between fields: the catalogue's, the algorithm's own (with the process count), LoRA's, the engine's."""
    entry = algorithm(draft.request.algorithm)
    processes = int(accelerate.get("num_processes") or 1)
    name = draft.value("dataset_name")
    prompt_file = Path(name) if isinstance(name, str) and Path(name).is_absolute() and Path(name).is_file() else None
    for check in (lambda values: cross_field_problems(values, draft.fields),
                  lambda values: entry.checks(values, processes),
                  lambda values: lora_problems(values, entry, is_zero3(accelerate)),
                  lambda values: engine_problems(values, draft.said, processes, cuda=not cpu_only,
                                                 planning=draft.request.planning),
                  lambda values: length_problems(values, entry.completion_field, prompt_file,
                                                 draft.value("dataset_prompt_column"))):
        try:
            draft.problems += check(draft.given)
        except Refused:
            pass  # judged once the refused value is fixed


def default_gather(draft: Draft) -> Setting:
    """When no source gives a gather choice: TRL's (gather) to generate; with vLLM the plan's bucket for its weight
    sync (`auto`), except under DoRA, whose magnitudes need the whole layer gathered (rlhf_cli/config/lora.py)."""
    engine = Engine.from_values(draft.value)
    if engine.separate and not draft.value("use_dora"):
        return Setting("auto", config_room(engine.spec).SYNC_DEFAULT_SOURCE)
    return Setting(draft.fields["ds3_gather_for_generation"].default, "default")


def completed_settings(draft: Draft, accelerate: dict[str, Any], cpu_only: bool) -> dict[str, Setting]:
    """The settings as they will run: the values rlhf chooses when the recipe does not (each with why)."""
    settings = dict(draft.settings)
    if "num_gpus" in settings:  # num_processes follows: the written recipe must agree with itself
        settings["num_processes"] = Setting(accelerate.get("num_processes"), "num_gpus x num_machines")
    settings.setdefault("ds3_gather_for_generation", default_gather(draft))
    settings.setdefault("ddp_timeout", Setting(round(COLLECTIVE_TIMEOUT_FACTOR * draft.value("stall_timeout")),
                                               f"rlhf: {COLLECTIVE_TIMEOUT_FACTOR} x stall_timeout"))
    if cpu_only:  # DeepSpeed's CPU path: fp32 (TRL turns bf16 on by default) over gloo
        reason = "rlhf: no CUDA on this machine"
        cpu_defaults = (("bf16", False), ("fp16", False), ("ddp_backend", "gloo"), ("dataloader_pin_memory", False))
        for name, value in cpu_defaults:
            settings.setdefault(name, Setting(value, reason))
        draft.notes.append("no CUDA here: the ranks run on DeepSpeed's CPU path (DS_ACCELERATOR=cpu, gloo)")
        if settings["bf16"].value and "use_cpu" not in settings:
            # transformers checks bf16 against the GPU unless told the run is on the CPU, where torch has bf16 too
            settings["use_cpu"] = Setting(True, "rlhf: bf16 without CUDA trains on the CPU")
            draft.notes.append("no CUDA here: bf16 as asked, on the CPU (use_cpu: true)")
    return settings
