"""Only whole checkpoints are resumed from: manifests, `--resume auto`, and what is said about the rest."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import RECIPES, write
from rlhf_cli.output.checkpoints import incomplete_reason, newest_complete_checkpoint, write_manifest
from rlhf_cli.config.resolve import RunRequest, resolve
from rlhf_cli.errors import ConfigError
from rlhf_cli.output.ownership import record_end
from rlhf_cli.output.run_dir import RunDir


def checkpoint(run_dir: Path, step: int, complete: bool = True) -> Path:
    path = run_dir / f"checkpoint-{step}"
    write(path / "model.safetensors", "w" * 100)
    write(path / "trainer_state.json", "{}")
    write(path / "global_step" / "zero_pp_rank_0_mp_rank_00_optim_states.pt", "o" * 50)
    if complete:
        write_manifest(path)
    return path


def resume_auto(run_dir: Path, tmp_path: Path, **request):
    flags = {"output_dir": ("-o", str(run_dir)), "resume_from_checkpoint": ("--resume", "auto")}
    return resolve(RunRequest("rloo", str(RECIPES / "rloo" / "smoke.yaml"), flags=flags, **request),
                   cwd=tmp_path, cuda=False)


def test_a_checkpoint_is_whole_only_with_every_file_at_its_size(tmp_path: Path) -> None:
    path = checkpoint(tmp_path, 4)
    assert incomplete_reason(path) is None
    (path / "model.safetensors").write_text("w" * 60)
    assert incomplete_reason(path) == "model.safetensors is truncated (60 of 100 bytes)"
    (path / "model.safetensors").unlink()
    assert incomplete_reason(path) == "model.safetensors is missing"
    assert "did not finish" in incomplete_reason(checkpoint(tmp_path, 8, complete=False))


def test_newest_whole_checkpoint_wins_and_the_broken_ones_are_named(tmp_path: Path) -> None:
    checkpoint(tmp_path, 4)
    checkpoint(tmp_path, 10)
    truncated = checkpoint(tmp_path, 12)
    (truncated / "global_step" / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_text("o")
    checkpoint(tmp_path, 16, complete=False)
    point = newest_complete_checkpoint(tmp_path)
    assert point.checkpoint == tmp_path / "checkpoint-10"  # 10 beats 4 by number, not by name
    assert [line.split(":")[0] for line in point.skipped] == ["checkpoint-16", "checkpoint-12"]


def test_resume_auto_skips_a_broken_checkpoint_with_a_warning(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    checkpoint(run_dir, 2)
    broken = checkpoint(run_dir, 4)
    (broken / "model.safetensors").unlink()
    write(run_dir / "recipe.yaml", "{}\n")
    record_end(RunDir(run_dir))  # the run already started here, its files its own: resuming it is no overwrite
    run = resume_auto(run_dir, tmp_path)
    assert run.value("resume_from_checkpoint") == str(run_dir / "checkpoint-2")
    assert "warning: --resume auto: skipping checkpoint-4: model.safetensors is missing" in run.notes
    assert run.settings["resume_from_checkpoint"].source == "flag --resume auto"


def test_resume_auto_with_nothing_to_resume_starts_from_the_beginning(tmp_path: Path) -> None:
    run = resume_auto(tmp_path / "fresh", tmp_path)
    assert run.value("resume_from_checkpoint") is None
    assert any("no complete checkpoint" in note and "starting from the beginning" in note for note in run.notes)


def test_resume_auto_needs_a_fixed_output_dir(tmp_path: Path) -> None:
    request = RunRequest("rloo", str(RECIPES / "rloo" / "smoke.yaml"),
                         flags={"resume_from_checkpoint": ("--resume", "auto")})
    with pytest.raises(ConfigError, match="--resume auto looks for checkpoints in the output dir"):
        resolve(request, cwd=tmp_path, cuda=False)


def test_resuming_a_named_broken_checkpoint_is_refused(tmp_path: Path) -> None:
    broken = checkpoint(tmp_path / "run", 4)
    (broken / "model.safetensors").write_text("")
    flags = {"output_dir": ("-o", str(tmp_path / "run")), "resume_from_checkpoint": ("--resume", str(broken))}
    with pytest.raises(ConfigError, match="model.safetensors is truncated.*pass an earlier checkpoint"):
        resolve(RunRequest("rloo", str(RECIPES / "rloo" / "smoke.yaml"), flags=flags), cwd=tmp_path, cuda=False)
