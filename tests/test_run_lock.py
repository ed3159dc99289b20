"""One run at a time in an output dir: machine rank 0's launcher holds it from before it writes anything until the
run ends; a second launch exits 2 naming the first (pid, host), and a dead run's lock is named as stale."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest

from helpers import hold_output_dir
from rlhf_cli.config import output_dir
from rlhf_cli.launch import runner
from rlhf_cli.launch.command import Launch
from rlhf_cli.output.lock import LOCK, LockHeld, acquire, holder, release
from rlhf_cli.output.run_dir import RunDir

# The ranks' stand-in: it runs only while the launcher holds the dir, and writes a model.
RANK = """
import os, pathlib, sys
os.read(int(os.environ["RLHF_START_GATE_FD"]), 2)
out = pathlib.Path(sys.argv[1])
assert (out / "rlhf.lock").is_file(), "the output dir is not held while the ranks run"
(out / "model.safetensors").write_text("trained")
"""


@pytest.fixture
def ranks(monkeypatch: pytest.MonkeyPatch, check_passes) -> None:
    monkeypatch.setattr(runner, "launch_command",
                        lambda run, verbosity="normal": Launch([sys.executable, "-c", RANK, str(run.output_dir)], {}))


def one_line(result) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("Error: "), result.output
    return " ".join(lines[0].split())


def test_a_second_launch_into_a_held_output_dir_names_the_first(cli, tmp_path: Path, nothing_launches) -> None:
    out = tmp_path / "out"
    first = hold_output_dir(out)
    try:
        for extra in ((), ("--resume", "auto"), ("--overwrite",), ("--dry-run",)):
            line = one_line(cli("rloo", "-r", "rloo/smoke", "-o", out, *extra))
            assert f"output dir {out} is in use by another rlhf run (pid {first.pid} on {socket.gethostname()}, " \
                   "since" in line, line
            assert "wait for it to end, or choose another --output-dir" in line
    finally:
        first.kill()
        first.wait()
    line = one_line(cli("rloo", "-r", "rloo/smoke", "-o", out))  # killed: its lock stays, and says so
    assert f"is locked by a run that is no longer running (pid {first.pid} on {socket.gethostname()}" in line
    assert f"remove {out / LOCK} and run again" in line
    (out / LOCK).unlink()
    assert cli("rloo", "-r", "rloo/smoke", "-o", out).exit_code == 0 and len(nothing_launches) == 1


def test_another_hosts_lock_is_taken_as_live_and_says_how_to_clear_it(cli, tmp_path: Path, nothing_launches) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK).write_text(json.dumps({"host": "node-17", "pid": 4242, "started": "2026-01-01T00:00:00"}))
    line = one_line(cli("rloo", "-r", "rloo/smoke", "-o", out))
    assert "in use by another rlhf run (pid 4242 on node-17, since 2026-01-01T00:00:00) (if that run is gone, " \
           f"remove {out / LOCK})" in line
    assert nothing_launches == []


def test_the_launcher_holds_the_dir_while_the_ranks_run_and_lets_go_at_the_end(cli, tmp_path: Path, ranks) -> None:
    out = tmp_path / "out"
    result = cli("rloo", "-r", "rloo/smoke", "-o", out)
    assert result.exit_code == 0, result.output
    assert (out / "model.safetensors").read_text() == "trained"
    assert not (out / LOCK).exists() and LOCK not in json.loads(RunDir(out).written.read_text())["entries"]
    assert cli("rloo", "-r", "rloo/smoke", "-o", out, "--overwrite").exit_code == 0  # held again, let go again
    assert not (out / LOCK).exists()


def test_a_launch_that_lost_the_race_after_its_check_writes_nothing(cli, tmp_path: Path, ranks,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Two launches both checked the dir before either held it: the launcher's own lock decides."""
    out = tmp_path / "out"
    first = hold_output_dir(out)
    monkeypatch.setattr(output_dir, "holder", lambda directory: None)  # its check ran before the first took it
    try:
        line = one_line(cli("rloo", "-r", "rloo/smoke", "-o", out, "-q"))  # -q: errors only, not the run's panel
    finally:
        first.kill()
        first.wait()
    assert f"is in use by another rlhf run (pid {first.pid} on" in line
    assert sorted(path.name for path in out.iterdir()) == [LOCK]


def test_a_launch_whose_dir_changed_after_its_check_writes_nothing(cli, tmp_path: Path, ranks,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The first run ended between the second's check and its lock: the second must not write over it."""
    out = tmp_path / "out"
    taken = runner.acquire

    def another_run_wrote_first(directory: Path) -> Path:
        directory.mkdir()
        (directory / "run.json").write_text("{}")
        return taken(directory)

    monkeypatch.setattr(runner, "acquire", another_run_wrote_first)
    line = one_line(cli("rloo", "-r", "rloo/smoke", "-o", out, "-q"))
    assert f"output dir {out} changed while the run was being checked (it now holds run.json)" in line
    assert sorted(path.name for path in out.iterdir()) == ["run.json"]


def test_the_lock_is_taken_once_and_released_only_by_its_holder(tmp_path: Path) -> None:
    lock = acquire(tmp_path)
    with pytest.raises(LockHeld):
        acquire(tmp_path)
    assert holder(tmp_path).alive is True
    lock.write_text(json.dumps({"host": socket.gethostname(), "pid": 1, "started": "x"}))  # taken over since
    release(lock)
    assert lock.exists()
    lock.unlink()
    release(acquire(tmp_path))
    assert holder(tmp_path) is None


def test_a_lock_that_names_no_run_is_said_damaged_in_one_line(cli, nothing_launches, tmp_path: Path) -> None:
    """A hand-made or damaged lock (no JSON, a directory, a link to a device, a pipe, a pid no process has) is
    named as such, read without blocking or following the link, and the run does not start."""
    import os

    def pipe(path: Path) -> None:
        os.mkfifo(path)

    states = {"empty": lambda p: p.write_text(""), "not the JSON record": lambda p: p.write_text("garbage{"),
              "a directory": lambda p: p.mkdir(), "a link": lambda p: p.symlink_to("/dev/zero"),
              "not a plain file": pipe,
              "pid 1180591620717411303424 on host": lambda p: p.write_text(json.dumps(
                  {"host": socket.gethostname(), "pid": 2**70, "started": "x"}))}
    for index, (said, make) in enumerate(states.items()):
        out = tmp_path / str(index)
        out.mkdir()
        make(out / LOCK)
        line = one_line(cli("rloo", "-r", "rloo/smoke", "-o", out, "--dry-run"))
        assert f"output dir {out} has a damaged lock {out / LOCK} ({said}" in line, line
        assert "if no rlhf run is starting there, remove it" in line
    assert nothing_launches == []
