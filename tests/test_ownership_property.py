"""A property over random output dirs: whatever a record says, `--overwrite`'s removal, the run's end,
`rlhf report`, a rehearsal into such a folder and `rlhf init --out NAME --force` change nothing outside the run's
own files (what runs write, right inside the output dir), or NAME itself.

Trees are drawn from a seeded generator (the same ones every run): the run's files, the user's files beside them,
links named like the run's files pointing outside, and records that list the run's files, the user's, `../x`,
absolute paths, links, or are not records at all; each finished or crashed (`running`).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from pathlib import Path

from helpers import REPO
from rlhf_cli.output.ownership import record_end, remove_owned
from rlhf_cli.output.run_dir import RunDir

TREES = 200
REPORTED = 10  # of them also get `rlhf report` (seconds each: matplotlib)
TRL_CARD = "# Model Card\n\nIt has been trained using [TRL](https://github.com/huggingface/trl).\n"
RUN_FILES = ("recipe.yaml", "run.json", "accelerate_config.yaml", "launch.sh", "model.safetensors", "config.json",
             "trainer_state.json", "summary.json", "report.png", "tokenizer.json", "training_args.bin")
RUN_DIRS = ("checkpoint-2", "checkpoint-10", "ranks", "merged", "runs")
USER_FILES = ("notes.txt", "thesis.tex", "my.yaml", "prompts.jsonl", ".env", "data.csv")
USER_DIRS = ("data", "papers", "checkpoint-x", "old-runs")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def snapshot(root: Path, skip: set[Path]) -> dict[str, tuple]:
    """Every entry under `root` but those under `skip`, as (kind, content): links by target, never followed."""
    found: dict[str, tuple] = {}
    for top, dirs, files in os.walk(root, followlinks=False):
        for name in dirs + files:
            path = Path(top) / name
            if any(path == s or s in path.parents for s in skip):
                continue
            key = str(path.relative_to(root))
            if path.is_symlink():
                found[key] = ("link", os.readlink(path))
            elif path.is_file():
                found[key] = ("file", digest(path))
            else:
                found[key] = ("dir",)
    return found


def draw_tree(rng: random.Random, root: Path) -> set[Path]:
    """An output dir `root/out` beside the user's `root/outside`; returns the run's own entries."""
    outside, out = root / "outside", root / "out"
    (outside / "deep").mkdir(parents=True)
    (outside / "secret.txt").write_text("the user's")
    (outside / "deep" / "model.safetensors").write_text("the user's model")
    out.mkdir()
    run: set[Path] = set()
    for name in rng.sample(RUN_FILES, rng.randint(0, len(RUN_FILES))):
        (out / name).write_text(f"run {name}")
        run.add(out / name)
    for name in rng.sample(RUN_DIRS, rng.randint(0, len(RUN_DIRS))):
        (out / name / "sub").mkdir(parents=True)
        (out / name / "sub" / "state.pt").write_text("run state")
        run.add(out / name)
    if rng.random() < 0.3:
        (out / "README.md").write_text(TRL_CARD)
        run.add(out / "README.md")
    elif rng.random() < 0.3:
        (out / "README.md").write_text("# my own notes\n")
    for name in rng.sample(USER_FILES, rng.randint(0, 3)):
        (out / name).write_text(f"user {name}")
    for name in rng.sample(USER_DIRS, rng.randint(0, 2)):
        (out / name).mkdir()
        (out / name / "kept.txt").write_text("user")
    free = [name for name in (*RUN_FILES, *RUN_DIRS) if not (out / name).exists()]
    for name in rng.sample(free, min(len(free), rng.randint(0, 3))):  # links named as the run's entries
        target = rng.choice([outside, outside / "secret.txt", outside / "deep", Path("../outside"), root])
        (out / name).symlink_to(target)
    if rng.random() < 0.2:  # inside a run's own directory, a link out is the run's to unlink, never to follow
        if out / "ranks" in run:
            (out / "ranks" / "escape").symlink_to(outside)
    _write_record(rng, out, root)
    return run


def _write_record(rng: random.Random, out: Path, root: Path) -> None:
    roll = rng.random()
    if roll < 0.1:
        return  # none: an older rlhf's dir, or the user's
    record = out / "rlhf-files.json"
    if roll < 0.2:
        record.write_text(rng.choice(["not json", "[]", '{"entries": "recipe.yaml"}', '{"entries": [1, null]}']))
        return
    present = [entry.name for entry in out.iterdir()]
    hostile = ["../outside", "../outside/secret.txt", str(root / "outside"), "", ".", "..", "ranks/../../outside",
               "outside", "/", "deep/../.."]
    entries = rng.sample(present, rng.randint(0, len(present))) + rng.sample(hostile, rng.randint(0, 4))
    record.write_text(json.dumps({"entries": entries, "running": rng.random() < 0.5}))


def trees(count: int, seed: int):
    rng = random.Random(seed)
    for index in range(count):
        yield index, random.Random(rng.getrandbits(64))


def test_overwrite_and_the_runs_end_change_nothing_outside_the_runs_own_files(tmp_path: Path) -> None:
    checked = removed = 0
    for index, rng in trees(TREES, seed=20261202):
        root = tmp_path / f"tree-{index}"
        run = draw_tree(rng, root)
        record = {root / "out" / "rlhf-files.json"}
        before = snapshot(root, run | record)
        remove_owned(RunDir(root / "out"))
        assert snapshot(root, run | record) == before, (index, sorted(before))
        removed += sum(not path.exists() for path in run)
        record_end(RunDir(root / "out"))
        remove_owned(RunDir(root / "out"))  # what the end recorded is still only the run's
        assert snapshot(root, run | record) == before, index
        checked += 1
        shutil.rmtree(root)
    assert checked == TREES and removed > TREES  # the property is not met by removing nothing


def test_report_changes_nothing_outside_the_runs_own_files(cli, tmp_path: Path) -> None:
    codes = []
    state = (REPO / "tests" / "fixtures" / "runs" / "rloo" / "trainer_state.json").read_text()
    for index, rng in trees(REPORTED, seed=7):
        root = tmp_path / f"tree-{index}"
        run = draw_tree(rng, root)
        (root / "out" / "trainer_state.json").unlink(missing_ok=True)
        if (root / "out" / "trainer_state.json").is_symlink():
            continue
        (root / "out" / "trainer_state.json").write_text(state)
        run |= {root / "out" / "trainer_state.json", root / "out" / "rlhf-files.json"}
        png = root / "out" / "report.png"
        new = not (png.exists() or png.is_symlink())
        mine = {png} if new or _lists_report(root / "out") else set()  # a new plot, or the run's own, is the run's
        before = snapshot(root, run | mine)
        result = cli("report", root / "out")
        assert result.exit_code in (0, 2), result.output
        assert snapshot(root, run | mine) == before, (index, result.output)
        codes.append(result.exit_code)
    assert {0, 2} <= set(codes)  # both drawn and refused: the trees reach both sides


def _lists_report(out: Path) -> bool:
    """Whether the record lists report.png, a plain file: then it is the run's to replace."""
    try:
        record = json.loads((out / "rlhf-files.json").read_text())
    except (OSError, ValueError):
        return False
    entries = record.get("entries") if isinstance(record, dict) else None
    plain = (out / "report.png").is_file() and not (out / "report.png").is_symlink()
    return isinstance(entries, list) and "report.png" in entries and plain


def test_a_rehearsal_into_a_drawn_folder_changes_nothing_outside_an_earlier_rehearsals_files(tmp_path: Path) -> None:
    """The rehearsal's folder is drawn like any output dir: refused with everything in place, or accepted and then
    cleared by the launcher's removal (`--overwrite`) of the run's own files only."""
    from rlhf_cli.config.rehearsal import checked_folder
    from rlhf_cli.errors import ConfigError

    outcomes, removed = [], 0
    for index, rng in trees(TREES // 4, seed=20261203):
        root = tmp_path / f"tree-{index}"
        run = draw_tree(rng, root)
        folder = root / "out.rehearsal"
        (root / "out").rename(folder)
        run = {folder / path.name for path in run}
        record = {folder / "rlhf-files.json"}
        if index % 2:  # half of them an earlier rehearsal alone: the user's files and links taken out
            for entry in folder.iterdir():
                if entry not in run | record:
                    entry.unlink() if entry.is_symlink() or entry.is_file() else shutil.rmtree(entry)
        before = snapshot(root, set())
        try:
            checked_folder(folder)
        except ConfigError as refused:
            assert len(refused.problems) == 1 and snapshot(root, set()) == before, index
            outcomes.append("refused")
            continue
        remove_owned(RunDir(folder))
        assert snapshot(root, run | record) == snapshot_without(before, root, run | record), index
        removed += sum(not path.exists() for path in run)
        outcomes.append("replaced")
        shutil.rmtree(root)
    assert {"refused", "replaced"} <= set(outcomes) and removed > 0  # the trees reach both sides


def snapshot_without(found: dict[str, tuple], root: Path, skip: set[Path]) -> dict[str, tuple]:
    """`found` (a snapshot of `root`) less the entries under `skip`."""
    return {key: value for key, value in found.items()
            if not any(root / key == s or s in (root / key).parents for s in skip)}


def test_init_force_onto_any_drawn_entry_changes_only_that_name(cli, tmp_path: Path, monkeypatch) -> None:
    """`rlhf init --out NAME --force`, NAME any entry of a drawn tree (a file, a link out, a hard link, a dir):
    the tree holds exactly what it held, but NAME, which is a new plain file or was refused."""
    written = 0
    for index, rng in trees(20, seed=3):
        root = tmp_path / f"tree-{index}"
        draw_tree(rng, root)
        out = root / "out"
        files = [entry for entry in out.iterdir() if entry.is_file() and not entry.is_symlink()]
        if files:
            os.link(files[0], out / "hard-link.yaml")
        name = rng.choice(sorted(entry.name for entry in out.iterdir()))
        before = snapshot(root, {out / name})
        monkeypatch.chdir(out)
        result = cli("init", "rloo", "--out", name, "--force")
        assert snapshot(root, {out / name}) == before, (index, name, result.output)
        if result.exit_code == 0:
            assert (out / name).is_file() and not (out / name).is_symlink()
            written += 1
        else:
            assert result.exit_code == 2 and (out / name).is_dir()
    assert written > 10
