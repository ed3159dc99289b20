"""The errors the CLI turns into one-line messages and exit codes."""

from __future__ import annotations

EXIT_USAGE = 2


class RlhfError(Exception):
    """A problem the user can fix; shown as `Error: ...` without a traceback."""

    exit_code = EXIT_USAGE


class ConfigError(RlhfError):
    """One or more problems in a recipe or in flags, found before anything is launched."""

    def __init__(self, *problems: str) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(problems))


class PlanError(RlhfError):
    """A choice left to the memory plan (`gather: auto`) that the plan cannot make; the message says what would fit."""


class OutputDirError(RlhfError):
    """The output dir cannot be written to (full, read-only, no permission), found before any rank starts."""
