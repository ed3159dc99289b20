"""A checkpoint saved by N processes, loaded by M: ZeRO-3's shards re-split, each rank's random numbers mapped.

DeepSpeed loads its own checkpoints only on the count that saved them (it refuses another data-parallel world
size). Its universal checkpoint holds every parameter and its optimizer states whole, which any count loads
(`checkpoint.load_universal`). So before training, global rank 0 converts the checkpoint into
`ranks/resharded/checkpoint-N/` of this run, beside links to the checkpoint's other files and the RNG states
of the ranks that exist in both runs (rank r continues rank r's; a single process reads `rng_state.pth`); the
others wait for it, and every rank resumes from there. The launcher has already made the accumulation steps keep
the checkpoint's global batch (rlhf_cli/config/resume.py). The folder is removed when the run ends.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from rlhf_cli import compat
from rlhf_cli.output.checkpoints import deepspeed_tag, saved_processes
from rlhf_cli.output.run_dir import MANIFEST, RunDir, checkpoint_step

DONE = "rlhf-resharded.json"  # written last by rank 0: the others start loading once it is there
RNG_STATE = "rng_state_{}.pth"
SINGLE_RNG_STATE = "rng_state.pth"  # what transformers saves and reads in a run of one process
WAIT_SECONDS = 0.5


def resharded_dir(output_dir: Path) -> Path:
    return RunDir(output_dir).ranks / "resharded"


def loadable_checkpoint(trainer: Any, checkpoint: str) -> str:
    """The checkpoint as this run's ranks load it: itself, when the processes that saved it are as many as this
    run's; else its re-split copy (every rank calls this)."""
    source = Path(checkpoint)
    saved, processes = saved_processes(source), trainer.accelerator.num_processes
    if saved is None or saved == processes:
        return checkpoint
    staged = resharded_dir(Path(trainer.args.output_dir)) / f"checkpoint-{checkpoint_step(source) or 0}"
    universal = trainer.is_deepspeed_enabled and deepspeed_tag(source) is not None
    if universal:
        trainer.accelerator.state.deepspeed_plugin.deepspeed_config["checkpoint"] = {"load_universal": True}
    if trainer.accelerator.is_main_process:
        shutil.rmtree(staged.parent, ignore_errors=True)  # an earlier attempt's
    trainer.accelerator.wait_for_everyone()
    if trainer.accelerator.is_main_process:
        _stage(source, staged, saved, processes, universal)
    else:
        while not (staged / DONE).is_file():  # a failure of rank 0 stops this rank through the watch
            time.sleep(WAIT_SECONDS)
    return str(staged)


def _stage(source: Path, staged: Path, saved: int, processes: int, universal: bool) -> None:
    staged.mkdir(parents=True)
    for path in source.iterdir():  # the trainer state, scheduler, model files: read as they are
        if path.name != MANIFEST and not path.name.startswith("rng_state") and not (
                universal and path.name == deepspeed_tag(source)):
            (staged / path.name).symlink_to(path.resolve())
    for rank in range(min(saved, processes)):
        kept = source / (RNG_STATE.format(rank) if saved > 1 else SINGLE_RNG_STATE)
        if kept.is_file():
            shutil.copyfile(kept, staged / (RNG_STATE.format(rank) if processes > 1 else SINGLE_RNG_STATE))
    if universal:
        tag = deepspeed_tag(source) or ""
        compat.convert_to_universal(source / tag, staged / tag)  # also writes staged/latest_universal
    (staged / DONE).write_text(json.dumps({"from": str(source), "saved_by_processes": saved,
                                           "loaded_by_processes": processes, "universal": universal}) + "\n")


def remove_resharded(output_dir: Path) -> None:
    """Once trained: the re-split copy holds the whole model and optimizer in fp32, nothing a run keeps."""
    shutil.rmtree(resharded_dir(output_dir), ignore_errors=True)
