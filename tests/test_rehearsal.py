"""`--rehearse` decided without a launch: the rehearsal run's settings and folder, the longest-prompts file, and the
verdict from a measurement."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers import RECIPES
from rlhf_cli.config.rehearsal import longest_prompts, rehearsal_run
from rlhf_cli.config.resolve import RunRequest, Setting, resolve
from rlhf_cli.errors import ConfigError
from rlhf_cli.output.lock import acquire
from rlhf_cli.output.ownership import record_end
from rlhf_cli.output.run_dir import RunDir
from rlhf_cli.plan.measured import verdict


def _run(tmp_path: Path, dataset: Path | str) -> object:
    flags = {"output_dir": ("--output-dir", str(tmp_path / "out")), "dataset_name": ("--dataset", str(dataset))}
    return resolve(RunRequest("rloo", str(RECIPES / "rloo" / "smoke.yaml"), flags), cwd=tmp_path, cuda=False)


def test_the_rehearsal_is_one_full_length_step_on_the_longest_prompts_in_its_own_folder(tmp_path: Path) -> None:
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": "x" * n}) + "\n" for n in (5, 400, 20, 30, 7, 10)))
    run = _run(tmp_path, data)
    rehearsal = rehearsal_run(run)
    folder = tmp_path / "out.rehearsal"
    assert rehearsal.output_dir == folder and not (tmp_path / "out").exists()
    assert not folder.exists()  # nothing is written into the folder before the launcher holds it
    assert rehearsal.value("max_steps") == 1 and rehearsal.value("save_steps") == 1
    assert rehearsal.value("generation_kwargs")["min_new_tokens"] == run.value("max_completion_length")
    kept = Path(rehearsal.value("dataset_name"))
    assert kept.is_relative_to(Path(os.environ["RLHF_CACHE"]))
    rows = [json.loads(line) for line in kept.read_text().splitlines()]
    assert [len(row["prompt"]) for row in rows][0] == 400 and len(rows) <= 6
    assert any("6 rows" in note and "400 characters" in note for note in rehearsal.notes)
    assert Path(rehearsal_run(run).value("dataset_name")) == kept  # the same prompts, the same file


def _earlier_rehearsal(folder: Path) -> None:
    """A folder as a finished rehearsal leaves it: the run's files, recorded as the run's."""
    (folder / "ranks").mkdir(parents=True)
    for name in ("run.json", "summary.json", "recipe.yaml"):
        (folder / name).write_text("{}")
    record_end(RunDir(folder))


def test_an_earlier_rehearsal_is_the_launchers_to_replace_and_nothing_else_is_touched(tmp_path: Path) -> None:
    run = _run(tmp_path, RECIPES / "smoke" / "prompts.jsonl")
    folder = tmp_path / "out.rehearsal"
    _earlier_rehearsal(folder)
    rehearsal = rehearsal_run(run)
    assert rehearsal.output_dir_entries == ("ranks", "recipe.yaml", "rlhf-files.json", "run.json", "summary.json")
    assert (folder / "run.json").exists()  # removed by the launcher only, once it holds the folder (--overwrite)


@pytest.mark.parametrize("state", ["notes beside", "dataset inside", "live lock", "stale lock", "other host's lock",
                                   "a link", "a file"])
def test_every_odd_rehearsal_folder_is_one_line_and_nothing_in_it_is_touched(tmp_path: Path, state: str) -> None:
    data = tmp_path / "prompts.jsonl"
    data.write_text((RECIPES / "smoke" / "prompts.jsonl").read_text())
    folder = tmp_path / "out.rehearsal"
    if state == "a file":
        folder.write_text("the user's")
    elif state == "a link":
        (tmp_path / "elsewhere").mkdir()
        _earlier_rehearsal(tmp_path / "elsewhere")
        folder.symlink_to(tmp_path / "elsewhere")
    else:
        _earlier_rehearsal(folder)
    if state == "notes beside":
        (folder / "notes.txt").write_text("the user's")
    elif state == "dataset inside":
        data = folder / "prompts.jsonl"
        data.write_text((RECIPES / "smoke" / "prompts.jsonl").read_text())
    elif state.endswith("lock"):
        acquire(folder)
        if state != "live lock":
            lock = json.loads((folder / "rlhf.lock").read_text())
            lock.update(pid=2**22 + 1) if state == "stale lock" else lock.update(host="another-host")
            (folder / "rlhf.lock").write_text(json.dumps(lock))
    before = _tree(tmp_path)
    with pytest.raises(ConfigError) as refused:
        rehearsal_run(_run(tmp_path, data))
    assert len(refused.value.problems) == 1 and "\n" not in refused.value.problems[0]
    assert refused.value.problems[0].startswith("--rehearse:")
    assert _tree(tmp_path) == before


def _tree(root: Path) -> dict[str, str]:
    """Every entry under `root` with its content (links by target, never followed)."""
    found = {}
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(top) / name
            found[str(path)] = (f"-> {os.readlink(path)}" if path.is_symlink() else
                                path.read_text() if path.is_file() else "dir")
    return found


def test_the_rehearsal_reads_the_prompt_column_the_run_names(tmp_path: Path) -> None:
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"question": "q" * n, "prompt": "p" * (50 - n)}) + "\n" for n in (3, 40, 9)))
    run = _run(tmp_path, data)
    run = replace(run, settings={**run.settings, "dataset_prompt_column": Setting("question", "flag --set")})
    rehearsal = rehearsal_run(run)
    rows = [json.loads(line) for line in Path(rehearsal.value("dataset_name")).read_text().splitlines()]
    assert len(rows[0]["question"]) == 40 and any("the longest 40 characters" in n for n in rehearsal.notes)


def test_a_hub_dataset_is_not_scanned(tmp_path: Path) -> None:
    run = _run(tmp_path, RECIPES / "smoke" / "prompts.jsonl")
    hub = replace(run, settings={**run.settings, "dataset_name": Setting("trl-lib/tldr", "flag --dataset")})
    rehearsal = rehearsal_run(hub)
    assert rehearsal.value("dataset_name") == "trl-lib/tldr" and any("not scanned" in n for n in rehearsal.notes)


def test_the_longest_prompts_are_kept_longest_first(tmp_path: Path) -> None:
    source = tmp_path / "rows.csv"
    source.write_text("prompt,id\nab,1\nabcdef,2\nabcd,3\n")
    text, read, longest = longest_prompts(source, "prompt", 2)
    assert (read, longest) == (3, 6)
    assert [json.loads(line)["id"] for line in text.splitlines()] == ["2", "3"]


def _plan(gpu_memory: int, smallest: object = None) -> object:
    return SimpleNamespace(known=True, hardware=SimpleNamespace(gpu_memory=gpu_memory), chosen=None,
                           smallest=smallest)


def test_the_verdict_names_the_phase_over_the_memory_and_what_would_fit() -> None:
    summary = {"phases": {"generation": {"seconds_per_step": 1.0, "peak_bytes": 900 * 2**20},
                          "train": {"seconds_per_step": 2.0, "peak_bytes": 600 * 2**20}},
               "memory": {"overall_peak_bytes": 900 * 2**20}}
    assert verdict(summary, _plan(2 * 2**30)).fits
    smallest = SimpleNamespace(candidate=SimpleNamespace(label="no-gather, opt+params->cpu"), peak=50 * 2**20)
    over = verdict(summary, _plan(64 * 2**20, smallest))
    assert not over.fits and over.line.startswith("rehearsal: generation peaked at 900.0 MiB")
    assert "no-gather, opt+params->cpu" in over.line
    assert "no configuration" in verdict(summary, _plan(64 * 2**20)).line
    overall_only = {"phases": {"train": {"seconds_per_step": 2.0, "peak_bytes": None}},
                    "memory": {"overall_peak_bytes": 900 * 2**20}}
    assert "overall peak only" in verdict(overall_only, _plan(64 * 2**20)).line


def test_the_rehearsal_predicts_the_whole_run_and_keeps_this_machines_corrections(monkeypatch, capsys) -> None:
    """From a rehearsal's phases (1 s generating, 2 s training per step, a 4 s save) a 10-step run saving every 5
    steps takes 10 x 3 + 2 x 4 s (the final save is the 10th step's); beside it the plan's; measured / planned is
    kept for this machine (calibrated here), and the next plan on it is multiplied by it, and says so."""
    from rlhf_cli.cli.output import print_rehearsal
    from rlhf_cli.machine import calibration, corrections
    from rlhf_cli.plan.estimate import plan_run
    from rlhf_cli.plan.measured import whole_run

    monkeypatch.setattr("rlhf_cli.machine.gpus.nvidia_smi", lambda query: [])
    measured = calibration.Calibration("cpu", 20e9, 4e9, 1e9, 1e-3, "gloo", 0.0, "here")
    path = calibration.cache_dir() / calibration.FILE_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(measured.__dict__))
    run = resolve(RunRequest("rloo", "rloo/smoke", {}, ("max_steps=10", "save_strategy=steps", "save_steps=5"),
                             planning=True), cuda=False)
    plan = plan_run(run)
    summary = {"phases": {"generation": {"seconds_per_step": 1.0, "peak_bytes": 2**20},
                          "train": {"seconds_per_step": 2.0, "peak_bytes": 2**20},
                          "saving": {"seconds_per_step": 4.0, "peak_bytes": 2**20}},
               "memory": {"overall_peak_bytes": 2**20}}
    total, planned = whole_run(summary, plan, 10, 5)
    assert total == 10 * 3.0 + 2 * 4.0 and planned == pytest.approx(plan.chosen.step_seconds * 10)
    assert print_rehearsal(summary, plan, run) == 0
    printed = capsys.readouterr().out
    assert "planned for this machine: this machine (cpu, calibrated)" in printed
    assert "whole run (10 steps): 0:00:38 from the rehearsal's phases" in printed
    factors = corrections.remembered(plan.hardware.gpu.name)
    assert factors["generation"] == pytest.approx(1.0 / plan.chosen.seconds["generation"])
    again = plan_run(run)
    assert again.chosen.seconds["generation"] == pytest.approx(1.0)
    assert "corrected by a rehearsal here" in again.hardware.gpu_source
