"""The one error boundary of `rlhf`: an exception type -> the lines to print and the exit code.

Every command raises; nothing catches on its own. `main()` hands whatever escapes to `exit_code_for`, which prints
one `Error: ...` line per problem (as plain text: paths and library messages may hold `[...]`) and never a
traceback, unless RLHF_DEBUG is on; the exit code is the same either way.
"""

from __future__ import annotations

import os
import signal
import traceback
from collections.abc import Callable, Mapping

import typer

from rlhf_cli.cli.output import print_error
from rlhf_cli.errors import EXIT_USAGE, RlhfError
from rlhf_cli.output.run_dir import signal_exit_code

EXIT_INTERNAL = 1  # a bug in rlhf, not a mistake of the user
EXIT_INTERRUPTED = signal_exit_code(signal.SIGINT)
DEBUG_ON = ("1", "true", "yes")


def debug_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """RLHF_DEBUG=1, true or yes (any case) shows tracebacks; anything else, 0 and false included, does not."""
    value = (os.environ if environ is None else environ).get("RLHF_DEBUG", "")
    return value.strip().lower() in DEBUG_ON


def _user_error(error: RlhfError) -> list[str]:
    return str(error).splitlines() or [type(error).__name__]


def _usage_error(error: typer.TyperException) -> list[str]:
    """The parser's own message in one line, with where to look: `rlhf rloo --help`."""
    context = getattr(error, "ctx", None)
    command = context.command_path if context is not None else "rlhf"
    return [f"{' '.join(error.format_message().split())} (see `{command} --help`)"]


def _os_error(error: OSError) -> list[str]:
    """The path the system refused and its reason: `runs/x: Permission denied`."""
    reason = error.strerror or str(error)
    paths = [str(path) for path in (error.filename, error.filename2) if path is not None]
    return [f"{' -> '.join(paths)}: {reason}" if paths else reason]


def _interrupted(error: BaseException) -> list[str]:
    return ["interrupted"]


def _internal(error: BaseException) -> list[str]:
    message = " ".join(str(error).split()) or "no message"
    return [f"internal error ({type(error).__name__}: {message}); rerun with RLHF_DEBUG=1 for the traceback "
            "and report it"]


# The first row whose type matches wins; the last row catches everything else.
ERRORS: tuple[tuple[type[BaseException], Callable, int | None], ...] = (
    (RlhfError, _user_error, None),  # None: the error's own exit code
    (typer.TyperException, _usage_error, None),  # a flag the parser refused: its exit code, 2
    (typer.Abort, _interrupted, EXIT_INTERRUPTED),
    (KeyboardInterrupt, _interrupted, EXIT_INTERRUPTED),
    (OSError, _os_error, EXIT_USAGE),
    (Exception, _internal, EXIT_INTERNAL),
)


def exit_code_for(error: BaseException, environ: Mapping[str, str] | None = None) -> int:
    """Print what went wrong and return the exit code; with RLHF_DEBUG on, the traceback first."""
    row = next((row for row in ERRORS if isinstance(error, row[0])), None)
    if row is None:
        raise error  # SystemExit and other BaseExceptions are not errors to report
    _, lines, code = row
    if debug_enabled(environ):
        traceback.print_exception(error)
    for line in lines(error):
        print_error(line)
    return error.exit_code if code is None else code  # type: ignore[attr-defined]
