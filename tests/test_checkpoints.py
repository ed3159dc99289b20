"""Only whole checkpoints are resumed from: manifests, `--resume auto`, and what is said about the rest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import RECIPES, write
from rlhf_cli.config.resolve import RunRequest, resolve
from rlhf_cli.errors import ConfigError
from rlhf_cli.output import checkpoints
from rlhf_cli.output.checkpoints import SavedBy, incomplete_reason, newest_complete_checkpoint, write_manifest
from rlhf_cli.output.ownership import record_end
from rlhf_cli.output.run_dir import MANIFEST, RunDir


def checkpoint(run_dir: Path, step: int, complete: bool = True) -> Path:
    path = run_dir / f"checkpoint-{step}"
    write(path / "model.safetensors", "w" * 100)
    write(path / "trainer_state.json", "{}")
    write(path / "latest", f"global_step{step}")
    write(path / f"global_step{step}" / "zero_pp_rank_0_mp_rank_00_model_states.pt", "m" * 20)
    write(path / f"global_step{step}" / "zero_pp_rank_0_mp_rank_00_optim_states.pt", "o" * 50)
    if complete:
        write_manifest(path, SavedBy("rloo", 1, 2, 2))
    return path


def resume_auto(run_dir: Path, tmp_path: Path, **request):
    flags = {"output_dir": ("-o", str(run_dir)), "resume_from_checkpoint": ("--resume", "auto")}
    return resolve(RunRequest("rloo", str(RECIPES / "rloo" / "smoke.yaml"), flags=flags, **request),
                   cwd=tmp_path, cuda=False)


def test_a_checkpoint_is_whole_only_with_every_file_at_its_size_and_content(tmp_path: Path) -> None:
    path = checkpoint(tmp_path, 4)
    assert incomplete_reason(path) is None
    (path / "trainer_state.json").write_text("{]")  # the right size, damaged
    assert incomplete_reason(path) == "trainer_state.json has changed since it was saved (its checksum differs)"
    (path / "trainer_state.json").write_text("{}")
    (path / "model.safetensors").write_text("w" * 60)
    assert incomplete_reason(path) == "model.safetensors is truncated (60 of 100 bytes)"
    (path / "model.safetensors").write_text("w" * 120)
    assert incomplete_reason(path) == "model.safetensors has changed (120 bytes, 100 when saved)"
    (path / "model.safetensors").unlink()
    assert incomplete_reason(path) == "model.safetensors is missing"
    assert "did not finish" in incomplete_reason(checkpoint(tmp_path, 8, complete=False))


def test_a_large_file_is_checked_by_its_size_and_ends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where a safetensors header and a zip's central directory are: a rewritten end is caught, and reading stays
    fast however large the file (only 2 x END_BYTES of it are read)."""
    monkeypatch.setattr(checkpoints, "WHOLE_FILE_LIMIT", 300)
    monkeypatch.setattr(checkpoints, "END_BYTES", 100)
    path = tmp_path / "checkpoint-2"
    write(path / "shard.pt", "a" * 1000)
    write_manifest(path, SavedBy("ppo", 1, 2, 2))
    (path / "shard.pt").write_text("a" * 500 + "b" + "a" * 499)  # inside the data: left to the loader
    assert incomplete_reason(path) is None
    (path / "shard.pt").write_text("a" * 999 + "b")
    assert incomplete_reason(path) == "shard.pt has changed since it was saved (its checksum differs)"


def test_a_manifest_of_an_older_rlhf_is_checked_by_sizes(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint-2"
    write(path / "trainer_state.json", "{}")
    write(path / MANIFEST, json.dumps({"files": {"trainer_state.json": 2}}))
    assert incomplete_reason(path) is None and checkpoints.saved_by(path) is None
    (path / "trainer_state.json").write_text("{ }")
    assert incomplete_reason(path) == "trainer_state.json has changed (3 bytes, 2 when saved)"


def test_newest_whole_checkpoint_wins_and_the_broken_ones_are_named(tmp_path: Path) -> None:
    checkpoint(tmp_path, 4)
    checkpoint(tmp_path, 10)
    truncated = checkpoint(tmp_path, 12)
    (truncated / "global_step12" / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_text("o")
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


def test_an_incomplete_checkpoint_of_an_rlhf_run_is_refused(tmp_path: Path) -> None:
    unfinished = checkpoint(tmp_path / "run", 4, complete=False)
    record_end(RunDir(tmp_path / "run"))
    flags = {"output_dir": ("-o", str(tmp_path / "new")), "resume_from_checkpoint": ("--resume", str(unfinished))}
    with pytest.raises(ConfigError, match="no rlhf-manifest.json \\(the save did not finish\\); pass an earlier"):
        resolve(RunRequest("rloo", str(RECIPES / "rloo" / "smoke.yaml"), flags=flags), cwd=tmp_path, cuda=False)


def zero3_checkpoint(path: Path, saved_by: SavedBy) -> Path:
    """A ZeRO-3 checkpoint's files (empty shards), whole by its manifest."""
    write(path / "trainer_state.json", "{}")
    write(path / "latest", "global_step4")
    for rank in range(saved_by.processes):
        write(path / "global_step4" / f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt", "m")
        write(path / "global_step4" / f"bf16_zero_pp_rank_{rank}_mp_rank_00_optim_states.pt", "o")
    write_manifest(path, saved_by)
    return path


def resume_on(processes: int, checkpoint_path: Path, tmp_path: Path, *sets: str, algorithm: str = "rloo"):
    flags = {"output_dir": ("-o", str(tmp_path / "new")), "resume_from_checkpoint": ("--resume", str(checkpoint_path)),
             "num_processes": ("--num-processes", processes)}
    return resolve(RunRequest(algorithm, str(RECIPES / algorithm / "smoke.yaml"), flags=flags, sets=sets),
                   cwd=tmp_path, cuda=False)


@pytest.mark.parametrize(("saved", "processes", "accumulation"), [(2, 1, 4), (2, 4, 1), (4, 2, 2), (2, 2, 2)])
def test_a_resume_on_another_process_count_keeps_the_global_batch(saved: int, processes: int, accumulation: int,
                                                                  tmp_path: Path) -> None:
    """8 rollouts per update, however many processes: PPO's smoke recipe saved by `saved` processes with
    8 / saved / 2 accumulation steps of 2 per device."""
    path = zero3_checkpoint(tmp_path / "checkpoint-2", SavedBy("ppo", saved, 2, 8 // saved // 2))
    run = resume_on(processes, path, tmp_path, algorithm="ppo")
    assert run.value("gradient_accumulation_steps") == accumulation
    assert run.value("num_processes") == processes
    changed = [note for note in run.notes if note.startswith(f"--resume {path}: saved by")]
    assert len(changed) == (saved != processes)
    if processes < saved:
        assert {1: "those of rank 1 are dropped", 2: "those of ranks 2-3 are dropped"}[processes] in changed[0]
        assert "re-split through DeepSpeed's universal checkpoint" in changed[0]


def test_a_global_batch_that_the_new_count_cannot_keep_is_refused(tmp_path: Path) -> None:
    path = zero3_checkpoint(tmp_path / "checkpoint-2", SavedBy("rloo", 2, 2, 1))  # 4 completions a step
    with pytest.raises(ConfigError, match="global batch of 4 \\(2 processes\\), which 3 processes x "
                                          "per_device_train_batch_size 2 cannot keep .*; run 1, 2 processes"):
        resume_on(3, path, tmp_path)


def test_an_explicit_steps_per_generation_scales_with_the_accumulation(tmp_path: Path) -> None:
    """RLOO's generation batch, per_device x processes x steps_per_generation, stays 8 prompts' completions."""
    path = zero3_checkpoint(tmp_path / "checkpoint-2", SavedBy("rloo", 2, 2, 2))
    run = resume_on(1, path, tmp_path, "gradient_accumulation_steps=2", "steps_per_generation=2")
    assert (run.value("gradient_accumulation_steps"), run.value("steps_per_generation")) == (4, 4)


@pytest.mark.parametrize("algorithm", ["rloo", "grpo", "online_dpo"])
def test_every_trl_algorithm_resumed_on_one_process_doubles_its_accumulation(algorithm: str, tmp_path: Path) -> None:
    """Their smoke recipes: 2 processes x 2 per device x 1 accumulation step; on 1 process, 2 steps keep the 4.
    With the manifest of an older rlhf (no saved_by), the shards give the count and this run the batch layout."""
    path = zero3_checkpoint(tmp_path / "checkpoint-2", SavedBy(algorithm, 2, 2, 1))
    (path / MANIFEST).write_text(json.dumps({"files": {}}))
    run = resume_on(1, path, tmp_path, algorithm=algorithm)
    assert run.value("gradient_accumulation_steps") == 2
    assert run.settings["gradient_accumulation_steps"].source == "rlhf: keeps checkpoint-2's global batch 4 on 1 " \
                                                                 "process"
