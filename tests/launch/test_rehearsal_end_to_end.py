"""`--rehearse` launched: one step on the longest prompts, its phases beside the plan, and the verdict's exit code
when the memory given is too small (the decisions alone: tests/test_rehearsal.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from helpers import RECIPES, launch_rlhf


def test_a_rehearsal_fits_and_the_same_rehearsal_in_64_mib_names_the_phase_over(
        tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rehearsal in 64 MiB is the launched one's record replayed: the CLI in-process, its launch answered with
    what the real rehearsal's ranks left (the verdict is the launcher's, after the ranks)."""
    from rlhf_cli.launch import runner

    rows = (RECIPES / "smoke" / "prompts.jsonl").read_text()
    data = tmp_path / "data.jsonl"
    data.write_text(rows + json.dumps({"prompt": "Tell me about apples. " * 40}) + "\n")
    out = tmp_path / "run"
    done = launch_rlhf("rloo", out, "--rehearse", "--dataset", str(data))
    assert done.returncode == 0
    assert "planned s/step" in done.stdout and "rehearsal: fits" in done.stdout
    assert not out.exists()  # nothing of the run's own
    kept = Path(yaml.safe_load((tmp_path / "run.rehearsal" / "recipe.yaml").read_text())["dataset_name"]).read_text()
    kept = kept.splitlines()
    assert json.loads(kept[0])["prompt"].startswith("Tell me about apples. Tell me")
    summary = json.loads((tmp_path / "run.rehearsal" / "summary.json").read_text())
    assert summary["max_steps"] == 1 and summary["phases"]["saving"]["seconds_per_step"] > 0

    notes = tmp_path / "run.rehearsal" / "notes.txt"
    notes.write_text("the user's")  # beside the rehearsal's files: another rehearsal there removes nothing
    refused = launch_rlhf("rloo", out, "--rehearse", "--dataset", str(data))
    assert refused.returncode == 2 and "notes.txt" in refused.stderr and notes.read_text() == "the user's"
    assert (tmp_path / "run.rehearsal" / "summary.json").exists()
    notes.unlink()

    rehearsed: list = []

    def replay(run, **_: object) -> runner.Outcome:
        rehearsed.append(run)
        return runner.Outcome(0, "finished", summary)

    monkeypatch.setattr(runner, "launch", replay)
    small = cli("rloo", "-r", RECIPES / "rloo" / "smoke.yaml", "-o", out, "--rehearse", "--dataset", data,
                "--gpu-memory", "64MiB")
    assert small.exit_code == 1 and [run.value("max_steps") for run in rehearsed] == [1]
    errors = [line for line in small.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "peaked at" in errors[0] and isinstance(small.exception, SystemExit)
    assert "Traceback" not in small.output
    assert any(f"rehearsal: {phase} peaked" in errors[0] for phase in ("generation", "sync", "saving", "train"))
