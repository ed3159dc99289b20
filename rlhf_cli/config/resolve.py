"""Flags + recipe -> one resolved run, with every problem found before anything starts.

Precedence: TRL's defaults < the recipe < command-line flags and `--set`. Every value keeps
the place it came from, so `--dry-run` can say why a value is what it is.

The steps, in order: the layers (rlhf_cli/config/layers.py, which locates each value through
rlhf_cli/config/locate.py) fill a draft (rlhf_cli/config/draft.py); the run checks
(rlhf_cli/config/run_checks.py) judge it whole; the accelerate config follows; the result is a
`ResolvedRun` (rlhf_cli/config/run.py), the one type everything after resolution reads.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlhf_cli.config import resume, run_checks
from rlhf_cli.config.accelerate import LAYOUT_KEYS, AccelerateChoices, build_accelerate_config
from rlhf_cli.config.agent_code import check_agent_data
from rlhf_cli.config.draft import Draft
from rlhf_cli.config.engines import check_server
from rlhf_cli.config.file_checks import run_problems
from rlhf_cli.config.layers import apply_command_line, apply_environment, apply_recipe
from rlhf_cli.config.processes import default_process_count
from rlhf_cli.config.recipe import Recipe, load_recipe
from rlhf_cli.config.run import RESUME_AUTO, ResolvedRun, RunRequest, Setting
from rlhf_cli.errors import ConfigError
from rlhf_cli.generation.choice import Generation
from rlhf_cli.machine.probe import cuda_present

__all__ = ["RESUME_AUTO", "ResolvedRun", "RunRequest", "Setting", "resolve"]

MACHINE_FIELDS = ("num_machines", "machine_rank", "main_process_ip", "main_process_port")


def resolve(request: RunRequest, *, cwd: Path | None = None, cuda: bool | None = None,
            environ: Mapping[str, str] | None = None) -> ResolvedRun:
    """Validate everything; raise ConfigError listing every problem at once."""
    environ = os.environ if environ is None else environ
    draft = Draft(request, (cwd or Path.cwd()).resolve())
    recipe = _read_recipe(draft)
    if recipe is not None:
        apply_recipe(draft, recipe)
    apply_environment(draft, environ)
    apply_command_line(draft)
    if recipe is None and request.recipe:  # the recipe's own keys are unknown: its problems stand for them
        raise ConfigError(*draft.problems)
    run_checks.settle_gather_budget(draft)
    run_checks.check_required(draft)
    run_checks.check_models(draft)
    run_checks.default_output_dir(draft)
    if not request.planning:
        resume.find_resume_point(draft)
        run_checks.check_output_dir(draft)
    for check in (run_checks.check_nvme_path, run_checks.check_gpu_memory, run_checks.check_hardware,
                  run_checks.check_data, check_agent_data, run_checks.check_mixture, run_checks.check_stall_timeout,
                  check_server):
        check(draft)
    cpu_only = not (cuda_present() if cuda is None else cuda) or environ.get("DS_ACCELERATOR") == "cpu"
    _default_process_count(draft, environ)
    accelerate, accelerate_notes = build_accelerate_config(_accelerate_choices(draft, cpu_only), draft.problems)
    run_checks.check_deepspeed_field(draft, accelerate)
    run_checks.check_nvme_use(draft, accelerate)
    if not request.planning:  # the plan reads config.json alone: it plans a model before its weights are there
        draft.problems += run_problems(_Given(draft), cuda=not cpu_only, environ=environ)
        resume.check_checkpoint(draft, accelerate)
        resume.keep_global_batch(draft, accelerate)
    run_checks.check_cpu_and_lora(draft, cpu_only)
    run_checks.check_across_fields(draft, accelerate, cpu_only)
    if draft.problems:
        raise ConfigError(*draft.problems)
    settings = run_checks.completed_settings(draft, accelerate, cpu_only)
    generation = Generation.from_values(lambda name: settings[name].value if name in settings else None)
    return ResolvedRun(request.algorithm, recipe.path if recipe else None, settings, accelerate, cpu_only,
                       generation, tuple(draft.notes + accelerate_notes), draft.output_dir_entries)


@dataclass(frozen=True)
class _Given:
    """The draft as rlhf_cli/config/file_checks.py reads it: keys that were refused read as absent."""

    draft: Draft

    @property
    def algorithm(self) -> str:
        return self.draft.request.algorithm

    def value(self, name: str) -> Any:
        known = name in self.draft.fields and name not in self.draft.refused
        return self.draft.value(name) if known else None

    def where(self, name: str) -> str:
        return self.draft.layers.get(name, ("", f"`{name}`"))[1]


def _default_process_count(draft: Draft, environ: Mapping[str, str]) -> None:
    """Nothing gives the count (no num_processes, num_gpus, accelerate config or scheduler): TRL's, not the
    bundled config's placeholder; the recipe's `env:` counts as the ranks' environment."""
    if {"num_processes", "num_gpus", "accelerate_config"} & (draft.settings.keys() | draft.refused):
        return
    count, source = default_process_count({**environ, **(draft.value("env") or {})})
    draft.settings["num_processes"] = Setting(count, source)


def _read_recipe(draft: Draft) -> Recipe | None:
    """The recipe, if one was given and it loads; its problems join the command line's, not replace them."""
    if not draft.request.recipe:
        return None
    try:
        return load_recipe(draft.request.recipe)
    except ConfigError as error:
        draft.problems += error.problems
        return None


def _accelerate_choices(draft: Draft, cpu_only: bool) -> AccelerateChoices:
    """What the accelerate config is built from: the values given, not the defaults (its own values stand)."""
    machines: dict[str, Any] = {name: draft.explicit(name) for name in MACHINE_FIELDS
                                if draft.explicit(name) is not None}
    return AccelerateChoices(
        user_config=None if "accelerate_config" in draft.refused else draft.value("accelerate_config"),
        num_processes=None if draft.outranks("num_gpus", "num_processes") else draft.value("num_processes"),
        num_gpus=draft.value("num_gpus"),
        machines=machines,
        offload_optimizer=draft.explicit("offload_optimizer"),
        offload_params=draft.explicit("offload_params"),
        nvme_path=draft.value("nvme_path"),
        gather=draft.value("ds3_gather_for_generation"),
        zero3={name: s.value for name, s in draft.settings.items()
               if draft.fields[name].group == "zero3" and s.value is not None},
        cpu_only=cpu_only,
        sources={name: said for name in LAYOUT_KEYS if (said := draft.said(name))},
        refused=frozenset(draft.refused),
        launching=not draft.request.planning,
    )
