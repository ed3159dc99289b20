"""The code an agent recipe names (`tools`, `environment_factory`, `rollout_func`), located as `reward_funcs` is.

Each entry is `file.py:name` (relative to the recipe, or to the working directory on the command line) or
`package.module:name`, checked here without running it (rlhf_cli/config/rewards.py). Whether each one imports
and is a valid tool is asked once more before launch, in the pre-launch check's own process
(rlhf_cli/rank/prelaunch.py), because that runs the user's code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlhf_cli.config.rewards import RewardSpecError, locate_code

AGENT_CODE_FIELDS = ("tools", "environment_factory", "rollout_func")


def _one(spec: Any, kind: str, label: str, base_dirs: tuple[Path, ...], cwd: Path,
         problems: list[str]) -> Any:
    if not isinstance(spec, str):
        problems.append(f"{label}: {spec!r} is not a string like file.py:{kind} or package.module:{kind}")
        return spec
    try:
        return locate_code(spec, base_dirs, cwd, kind)
    except RewardSpecError as error:
        problems.append(f"{label}: {error}")
        return spec


def locate_agent_code(field: str, value: Any, where: str, base_dirs: tuple[Path, ...], cwd: Path,
                      problems: list[str]) -> Any:
    """The field's value with files made absolute; what cannot work is added to `problems`."""
    label = f"{where}: `{field}`"
    if field == "tools":
        return [_one(spec, "function", label, base_dirs, cwd, problems) for spec in value]
    if field == "environment_factory" and isinstance(value, dict):
        located = {}
        for name, spec in value.items():
            if not isinstance(name, str) or not name:
                problems.append(f"{label}: {name!r} is not an environment name (the dataset's `environment` "
                                "column names one)")
            located[name] = _one(spec, "class", f"{where}: `{field}.{name}`", base_dirs, cwd, problems)
        return located
    kind = "class" if field == "environment_factory" else "function"
    return _one(value, kind, label, base_dirs, cwd, problems)


def own_data_problem(environment: Any, max_steps: Any) -> str | None:
    """Without a dataset, GRPOTrainer lets a single environment own the data (its `reset` writes each prompt),
    for `max_steps` steps; a mapping of environments needs the dataset's `environment` column to pick one."""
    if isinstance(environment, dict):
        return ("no dataset: a mapping `environment_factory` picks each row's environment by the dataset's "
                "`environment` column; set `dataset_name`, or name one environment class")
    if not isinstance(max_steps, int) or max_steps <= 0:
        return ("no dataset: an environment that owns its data trains for `max_steps` steps (TRL's rule without a "
                "dataset); set max_steps (or --max-steps), or `dataset_name`")
    return None


def check_agent_data(draft: Any) -> None:
    """What GRPOTrainer would die of at its first step, read from a local prompt file's first rows: plain-text
    prompts with tools (tool schemas render only into chat messages), and a mapping `environment_factory` whose
    rows lack the `environment` column or name an environment it does not have."""
    from rlhf_cli.config.data_files import READERS, DataFileError, first_rows

    if {"tools", "environment_factory", "dataset_name"} & draft.refused:
        return  # judged against code or data that is being fixed
    tools, environment = (draft.value(name) if name in draft.fields else None
                          for name in ("tools", "environment_factory"))
    name = draft.value("dataset_name")
    if not (tools or environment) or not (isinstance(name, str) and Path(name).is_absolute()
                                          and Path(name).suffix in READERS and Path(name).is_file()):
        return
    try:
        columns, rows = first_rows(Path(name))
    except DataFileError:
        return  # check_data says why
    where = draft.layers["dataset_name"][1]
    column = draft.value("dataset_prompt_column")
    plain = next((line for line, row in rows if isinstance(row, dict) and isinstance(row.get(column), str)), None)
    if plain is not None:
        draft.problems.append(f"{where}: {name}:{plain}: `{column}` is plain text, and with `tools` or "
                              "`environment_factory` GRPOTrainer renders the tools only into chat messages; write "
                              'each prompt as [{"role": "user", "content": ...}]')
    if not isinstance(environment, dict):
        return
    if columns and "environment" not in columns:
        draft.problems.append(f"{where}: {name} has no `environment` column, which picks each row's environment "
                              f"of `environment_factory` ({', '.join(environment)}); add it, or name one class")
        return
    unknown = next(((line, row["environment"]) for line, row in rows
                    if isinstance(row, dict) and row.get("environment") not in environment), None)
    if unknown is not None:
        draft.problems.append(f"{where}: {name}:{unknown[0]}: `environment` is {unknown[1]!r}, not one of "
                              f"`environment_factory`'s ({', '.join(environment)})")
