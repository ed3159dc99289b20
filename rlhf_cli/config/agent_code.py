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
