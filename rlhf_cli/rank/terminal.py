"""What a rank shows the user: rlhf's own lines only, unless --verbose.

Libraries print from Python and from C: torch's cpp_extension warnings, DeepSpeed's op builds, datasets' and
transformers' progress bars. No logging level reaches all of them, so in normal and quiet mode the rank points its
file descriptors 1 and 2 at its log file (`ranks/rank-N.log`) before importing any of them, and keeps a copy of
the terminal for rlhf's own output (`stdout()`, `stderr()`). An error logged by a library still reaches the user,
in one line, and the rank's own failure is printed by the launcher from its error record. Imports nothing heavy:
it runs before torch is imported.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from rlhf_cli.output.run_dir import OUTPUT_MODE_ENV

_kept: dict[int, TextIO] = {}  # 1 and 2: the terminal (or the launcher's pipes), for rlhf's own lines


class _OneLine(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        first = record.getMessage().strip().splitlines()
        return f"{record.levelname.lower()} ({record.name}): {first[0] if first else 'no message'}"


def output_mode() -> str:
    return os.environ.get(OUTPUT_MODE_ENV, "normal")


def keep_terminal_for_rlhf(mode: str, log: Path) -> None:
    """Unless `mode` is verbose: everything written to fd 1 and 2 goes to `log`; rlhf writes through stdout() and
    stderr(); library errors get one line there."""
    if mode == "verbose" or _kept:
        return
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    for fd in (1, 2):
        _kept[fd] = os.fdopen(os.dup(fd), "w", buffering=1)
    target = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for fd in (1, 2):
        os.dup2(target, fd)
    os.close(target)
    errors = logging.StreamHandler(_kept[2])
    errors.setLevel(logging.ERROR)
    errors.setFormatter(_OneLine())
    logging.getLogger().addHandler(errors)


def stdout() -> TextIO:
    return _kept.get(1, sys.stdout)


def stderr() -> TextIO:
    return _kept.get(2, sys.stderr)


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class Phases:
    """Rank 0's line while nothing else moves (imports, loading the models, building the engine): in a terminal
    one line redrawn in place with its elapsed time, otherwise one line per phase. Silent when `shown` is False."""

    def __init__(self, shown: bool) -> None:
        self.shown = shown
        self.started = time.monotonic()
        self.console: Any = None
        self.live: Any = None
        self.task: Any = None

    def show(self, text: str) -> None:
        if not self.shown:
            return
        if self.console is None:
            from rich.console import Console

            self.console = Console(file=stdout())
        if not self.console.is_terminal:
            self.console.print(f"{text}  elapsed {_clock(time.monotonic() - self.started)}", markup=False,
                               highlight=False, soft_wrap=True)
            return
        if self.live is None:
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self.live = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                                 console=self.console, transient=True)
            self.task = self.live.add_task(text, total=None)
            self.live.start()
        self.live.update(self.task, description=text)

    def stop(self) -> None:
        """Before the training bar takes the line."""
        if self.live is not None:
            self.live.stop()
            self.live = None


PHASES = Phases(shown=False)  # rank 0 replaces it at start (rlhf_cli/rank/__main__.py)
