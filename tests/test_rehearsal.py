"""`--rehearse` decided without a launch: the rehearsal run's settings and folder, the longest-prompts file, and the
verdict from a measurement."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers import RECIPES
from rlhf_cli.config.rehearsal import PROMPTS_FILE, rehearsal_run, write_longest_prompts
from rlhf_cli.config.resolve import RunRequest, Setting, resolve
from rlhf_cli.errors import ConfigError
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
    assert rehearsal.output_dir == folder and not (tmp_path / "out" / "run.json").exists()
    assert rehearsal.value("max_steps") == 1 and rehearsal.value("save_steps") == 1
    assert rehearsal.value("generation_kwargs")["min_new_tokens"] == run.value("max_completion_length")
    rows = [json.loads(line) for line in (folder / PROMPTS_FILE).read_text().splitlines()]
    assert rehearsal.value("dataset_name") == str(folder / PROMPTS_FILE)
    assert [len(row["prompt"]) for row in rows][0] == 400 and len(rows) <= 6
    assert any("6 rows" in note and "400 characters" in note for note in rehearsal.notes)
    (folder / "run.json").write_text("{}")  # an earlier rehearsal: replaced
    assert (rehearsal_run(run).output_dir / PROMPTS_FILE).exists() and not (folder / "run.json").exists()


def test_a_hub_dataset_is_not_scanned_and_a_foreign_folder_is_not_removed(tmp_path: Path) -> None:
    run = _run(tmp_path, RECIPES / "smoke" / "prompts.jsonl")
    hub = replace(run, settings={**run.settings, "dataset_name": Setting("trl-lib/tldr", "flag --dataset")})
    rehearsal = rehearsal_run(hub)
    assert rehearsal.value("dataset_name") == "trl-lib/tldr" and any("not scanned" in n for n in rehearsal.notes)
    (tmp_path / "other").mkdir()
    (tmp_path / "other.rehearsal").mkdir()
    (tmp_path / "other.rehearsal" / "mine.txt").write_text("keep")
    elsewhere = replace(run, settings={**run.settings, "output_dir": Setting(str(tmp_path / "other"), "flag -o")})
    with pytest.raises(ConfigError):
        rehearsal_run(elsewhere)
    assert (tmp_path / "other.rehearsal" / "mine.txt").read_text() == "keep"


def test_the_longest_prompts_are_kept_longest_first(tmp_path: Path) -> None:
    source = tmp_path / "rows.csv"
    source.write_text("prompt,id\nab,1\nabcdef,2\nabcd,3\n")
    read, longest = write_longest_prompts(source, "prompt", 2, tmp_path / "out.jsonl")
    assert (read, longest) == (3, 6)
    assert [json.loads(line)["id"] for line in (tmp_path / "out.jsonl").read_text().splitlines()] == ["2", "3"]


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
