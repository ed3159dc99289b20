"""May a run write into its output directory? Never over a file the user wrote, nor in or around its own inputs.

A run writes its model, checkpoints and records into the output dir, replacing files of the same name. So the
directory must be new, empty, or hold only what an earlier run wrote (rlhf_cli/output/ownership.py); it must not be,
contain or lie inside any input the run reads (models, data, reward files, the recipe), unless that input is the
run's own earlier output; and `--overwrite` removes only an earlier run's files, never one the run still reads.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from rlhf_cli.output.lock import holder
from rlhf_cli.output.ownership import LISTED, Holdings, holdings, listing


@dataclass(frozen=True)
class Input:
    """A local file or directory the run reads: what it is (`model_name_or_path`, the recipe) and where."""

    label: str
    path: Path
    read_by_ranks: bool = True  # the recipe and accelerate config are read before launch; models, data after


@dataclass
class OutputDirCheck:
    output_dir: Path
    flag: str  # how the problem names the output dir: `-o DIR`, `output_dir` (recipe.yaml:3)
    overwrite: bool = False
    resume: str | None = None  # `auto`, a checkpoint path, or None
    problems: list[str] = field(default_factory=list)
    entries: tuple[str, ...] = ()  # what the directory held when it was checked

    def check(self, inputs: Iterable[Input], resume_found: bool) -> list[str]:
        """Every reason the run must not write here; `resume_found`: `--resume auto` found a checkpoint."""
        running = holder(self.output_dir)
        if running is not None:  # another run writes here: nothing else about the directory holds for long
            self.problems.append(running.problem(self.flag))
            return self.problems
        held = holdings(self.output_dir)
        self.entries = held.entries
        inside = [item for item in inputs if self._in_the_way(item, held)]
        if inside:  # one line for them all; the files there are the user's, which says the rest
            where = "is" if inside[0].path == self.output_dir else "contains"
            named = "; ".join(f"{item.label} {item.path}" for item in inside[:LISTED])
            self.problems.append(f"{self.flag}: output dir {self.output_dir} {where} the run's {named}: the run would "
                                 "write over it; choose another --output-dir")
        if self.problems:
            return self.problems
        if held.foreign:
            self.problems.append(
                f"{self.flag}: output dir {self.output_dir} holds files rlhf did not write ({listing(held.foreign)}), "
                "which the run would overwrite; choose a new or empty --output-dir, or move them out")
        elif held.holds_run:
            self._check_earlier_run(held, resume_found)
        return self.problems

    def _in_the_way(self, item: Input, held: Holdings) -> bool:
        """Whether the run would write over `item` (it is, or lies in, the output dir and is not the run's own
        output); an input the output dir lies inside, or one --overwrite would remove, is a problem of its own."""
        path = item.path
        if path in self.output_dir.parents:
            self.problems.append(f"{self.flag}: output dir {self.output_dir} lies inside the run's {item.label} "
                                 f"{path}; choose an --output-dir outside it")
        if path != self.output_dir and self.output_dir not in path.parents:
            return False
        top = path.relative_to(self.output_dir).parts[:1]
        if not (held.holds_run and (not top or top[0] in held.owned or held.running)):
            return True
        if self.overwrite and item.read_by_ranks:
            self.problems.append(f"--overwrite would remove the run's {item.label} {path}, an earlier run's "
                                 "output in the output dir; drop --overwrite or copy it elsewhere first")
        return False

    def _check_earlier_run(self, held: Holdings, resume_found: bool) -> None:
        what = f"{listing(held.entries)}; {held.status or 'unfinished'}"
        if self.overwrite and self.resume is not None and self.resume_in_output_dir():
            self.problems.append(f"--overwrite removes the earlier run in {self.output_dir}, and --resume "
                                 f"{self.resume} continues it; keep one")
        elif self.overwrite:
            return
        elif self.resume is None:
            self.problems.append(
                f"{self.flag}: output dir {self.output_dir} already holds a run ({what}); continue it with "
                "--resume auto, start it again with --overwrite (removes only what rlhf wrote there), or choose "
                "another --output-dir")
        elif self.resume == "auto" and not resume_found and held.status == "finished":
            self.problems.append(
                f"--resume auto: the run in {self.output_dir} finished and left no checkpoint to continue from, "
                "so it would be trained again over itself; start again with --overwrite, or choose another "
                "--output-dir")

    def resume_in_output_dir(self) -> bool:
        if self.resume == "auto":
            return True
        path = Path(self.resume or "")
        return path.is_absolute() and (path == self.output_dir or self.output_dir in path.parents)
