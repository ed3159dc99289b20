"""How rlhf starts its own Python processes (the launch supervisor, the ranks, the pre-launch checker, vLLM's
server): a module run with the working directory last on the import path.

`python -m` puts the working directory first, so a user's `logging.py` or `random.py` there replaces the standard
library in every process started from it. `python -P` (Python 3.11+, and rlhf supports 3.10) and `-I` (which also
drops PYTHONPATH and the user's site-packages) take the directory away altogether, and with it the reward modules
and tools users keep there and name by module. Last on the path, it still supplies those, and shadows nothing.
"""

from __future__ import annotations

from pathlib import Path

START_SCRIPT = Path(__file__).with_name("start") / "rlhf_start_module.py"


def module_argv(python: str, module: str) -> list[str]:
    """`python -m module` with the working directory last on the import path; the module's arguments follow."""
    return [python, *script_argv(module)]


def script_argv(module: str) -> list[str]:
    """The same, for a launcher that adds the interpreter itself (accelerate's, to run a script on each rank)."""
    return [str(START_SCRIPT), module]
