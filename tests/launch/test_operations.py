"""Operating real runs (2 ranks, ZeRO-3 on the CPU): preemption and resume, faults (a failing, killed or blocked rank,
a full disk). Two machines on one host: a conformance case's run (tests/launch/test_conformance.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from helpers import FIXTURES, RECIPES, rlhf_argv
from fixtures.rewards import BLOCKED_FILE_ENV, MARKUP
from rlhf_cli.algorithms import algorithm
from rlhf_cli.output.checkpoints import incomplete_reason
from rlhf_cli.config.resolve import RunRequest, resolve
from rlhf_cli.plan.estimate import plan_run
from rlhf_cli.output.run_dir import MANIFEST, RunDir

# Six steps, room to stop after the second and go on: PPO counts episodes (8 per update in its smoke recipe), the
# others steps.
STEPS = 6
RUN_LENGTH = {"ppo": ("--set", f"total_episodes={8 * STEPS}")}
# What SLURM sends before it kills a job: SIGTERM on preemption, SIGUSR1 with --signal=USR1@SECONDS. PPO (our own
# loop and checkpoints) gets one, online DPO the other: TRL's trainers stop and resume through transformers'
# Trainer alike, and online DPO is the one whose ranks rlhf reseeds (each its own random numbers, a resume's too).
PREEMPTION_SIGNAL = {"ppo": signal.SIGTERM, "online-dpo": signal.SIGUSR1}
# A requeued job gets the GPUs that are free: PPO's 2-process checkpoint resumes on 1 process (ZeRO-3's shards
# re-split, the accumulation doubled), online DPO's on the 2 that saved it. RLOO's: the full-disk test below.
RESUME_PROCESSES = {"ppo": ("--num-processes", "1")}


def finish(process: subprocess.Popen, lines: list[str]) -> tuple[int, str, str]:
    """Wait for a run; print its output for the failure report; (exit code, stdout, stderr)."""
    rest, stderr = process.communicate(timeout=480)
    stdout = "".join(lines) + rest
    print(stdout[-4000:], stderr[-8000:], sep="\n")
    return process.returncode, stdout, stderr


@pytest.mark.parametrize("command", PREEMPTION_SIGNAL)
def test_a_preemption_signal_checkpoints_and_resume_auto_finishes_the_same_steps(command: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    argv = rlhf_argv(command, out, *RUN_LENGTH.get(command, ("--max-steps", str(STEPS))))
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    for line in process.stdout:  # not a terminal: one plain line per logged step
        lines.append(line)
        if line.startswith(f"step 2/{STEPS}"):
            process.send_signal(PREEMPTION_SIGNAL[command])
            break
    code, stdout, stderr = finish(process, lines)
    assert code == 75, "preemption has its own exit code"
    metric, label = algorithm(command).headline_metrics[0]  # logged every step, shown on its progress line
    assert any(line.startswith(f"step 1/{STEPS}") and f" {label} " in line and "eta" in line for line in lines)
    preempted = json.loads((out / "preempted.json").read_text())
    stopped = preempted["step"]
    assert 2 <= stopped < STEPS and preempted["signal"] == PREEMPTION_SIGNAL[command].name
    assert incomplete_reason(Path(preempted["checkpoint"])) is None  # whole: every file at its recorded size
    assert "--resume auto" in stderr
    written = json.loads((out / "rlhf-files.json").read_text())  # all the run's, for --overwrite to remove
    assert not written["running"] and {"ranks", "preempted.json", f"checkpoint-{stopped}"} <= set(written["entries"])

    resumed_on = RESUME_PROCESSES.get(command, ())
    code, stdout, stderr = finish(subprocess.Popen(argv + ["--resume", "auto", *resumed_on], stdout=subprocess.PIPE,
                                                   stderr=subprocess.PIPE, text=True), [])
    assert code == 0
    assert f"--resume auto: continuing from {out / f'checkpoint-{stopped}'}" in stderr
    first = next(line for line in stdout.splitlines() if line.startswith("step "))
    assert first.startswith(f"step {stopped + 1}/{STEPS}")  # it went on from the checkpoint, it did not start over
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == STEPS
    steps = [entry["step"] for entry in state["log_history"] if metric in entry]
    assert steps == list(range(1, STEPS + 1))  # every step of an uninterrupted run, each once
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["resumed_from_step"] == stopped
    assert not (out / "preempted.json").exists()
    if resumed_on:
        assert_resumed_on_fewer_processes(out, stderr, stopped, "objective/kl")
        logged = [entry for entry in state["log_history"] if metric in entry]
        assert [entry["episode"] for entry in logged] == [8 * step for step in steps]  # 8 rollouts an update, kept
        rates = [entry["lr"] for entry in logged]  # the linear schedule, unbroken
        assert all(abs((a - b) - (rates[0] - rates[1])) < 1e-12 for a, b in zip(rates, rates[1:], strict=False))


def assert_resumed_on_fewer_processes(out: Path, stderr: str, stopped: int, kl: str) -> None:
    """A 2-process checkpoint resumed on 1: said, its global batch kept by the accumulation steps, its weights
    loaded from the re-split shards (the policy's KL to the reference it started as is no longer 0), the
    re-split copy removed at the end."""
    assert "saved by 2 processes, resumed on 1: gradient_accumulation_steps" in " ".join(stderr.split())
    assert [rank["world_size"] for rank in json.loads((out / "run.json").read_text())["ranks"]] == [1]
    assert not (out / "ranks" / "resharded").exists()
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    assert next(entry[kl] for entry in history if entry.get("step") == stopped + 1 and kl in entry) != 0.0


def errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("Error:")]


def test_a_rank_that_raises_ends_the_job_with_its_error_once(tmp_path: Path) -> None:
    out = tmp_path / "run"
    argv = rlhf_argv("rloo", out, "--set", "reward_model_name_or_path=null",
                     "--set", f"reward_funcs=[{FIXTURES}/rewards.py:fails_on_rank_1]", "--max-steps", "50")
    started = time.monotonic()
    code, stdout, stderr = finish(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
                                  [])
    assert time.monotonic() - started < 90  # start-up included; no wait on a collective's timeout
    assert code == 1
    assert stderr.count("Traceback (most recent call last)") == 1  # rank 1's, not accelerate's or torch's
    assert f"ValueError: reward server returned 503 {MARKUP}\n" in stderr  # rich markup in it, printed as text
    assert errors(stderr) == [f"Error: rank 1 on {os.uname().nodename} failed: ValueError: reward server returned 503 "
                              f"{MARKUP} (traceback above and in {RunDir(out).rank_error(1)})"]
    record = json.loads((out / "ranks" / "rank-1.error.json").read_text())
    assert record["first"] is True and "fails_on_rank_1" in record["traceback"]
    assert json.loads((out / "run.json").read_text())["status"] == "failed"


def test_a_rank_killed_by_sigkill_is_named_in_one_line_within_seconds(tmp_path: Path) -> None:
    """What the kernel's out-of-memory killer does; the survivor's "Connection reset by peer" is not the cause."""
    out = tmp_path / "run"  # the optimizer in CPU memory: the plan has a CPU need to name
    process = subprocess.Popen(rlhf_argv("rloo", out, "--max-steps", "400", "--offload-optimizer", "cpu"),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    for line in process.stdout:
        lines.append(line)
        if line.startswith("step 2/400"):
            break
    os.kill(json.loads(RunDir(out).heartbeat(1).read_text())["pid"], signal.SIGKILL)
    killed = time.monotonic()
    code, stdout, stderr = finish(process, lines)
    print(f"killed -> rlhf exited: {time.monotonic() - killed:.1f} s")
    assert time.monotonic() - killed < 10
    assert code == 1 and "Traceback" not in stderr
    [line] = errors(stderr)
    size = r"[\d.]+ [KMGT]iB"
    assert re.fullmatch(rf"Error: rank 1 on {os.uname().nodename} was killed by SIGKILL \(often the out-of-memory "
                        rf"killer: this machine has {size}, the plan needs {size} of CPU memory per machine\)", line)


STALL_TIMEOUT = 10


def test_a_rank_that_blocks_stops_the_job_within_the_stall_timeout_with_every_stack(tmp_path: Path) -> None:
    out, blocked = tmp_path / "run", tmp_path / "blocked"
    argv = rlhf_argv("rloo", out, "--set", "reward_model_name_or_path=null", "--max-steps", "50",
                     "--set", f"reward_funcs=[{FIXTURES}/rewards.py:blocks_on_rank_1]",
                     "--stall-timeout", str(STALL_TIMEOUT))
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, BLOCKED_FILE_ENV: str(blocked)})
    code, stdout, stderr = finish(process, [])
    print(f"rank 1 blocked -> rlhf exited: {time.time() - blocked.stat().st_mtime:.1f} s")
    assert time.time() - blocked.stat().st_mtime < STALL_TIMEOUT + 30
    assert code == 1 and "Traceback" not in stderr
    run_dir = RunDir(out)
    [line] = errors(stderr)
    assert line.startswith(f"Error: rank 1 on {os.uname().nodename} stalled: no progress for ")
    assert line.endswith(f"s while the other ranks waited for it in a collective (stall_timeout {STALL_TIMEOUT} s); "
                         f"Python stack: {run_dir.stack(1)} (every rank's beside it)")
    assert "in blocks_on_rank_1" in run_dir.stack(1).read_text()  # where it hangs
    assert "torch/distributed/" in run_dir.stack(0).read_text()  # waiting for it in a collective


def test_a_full_disk_while_saving_ends_in_one_line_and_resume_auto_goes_on(tmp_path: Path) -> None:
    """6 MiB of disk: checkpoints 2 and 4 fit (2.5 MiB each), checkpoint-6 does not. Resumed on 1 process: RLOO's
    2-process checkpoint re-split."""
    if os.geteuid() != 0:
        pytest.skip("a full disk is a small tmpfs, and mounting one needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(disk)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        out = disk / "run"
        argv = rlhf_argv("rloo", out, "--max-steps", "6", "--set", "save_strategy=steps", "--set", "save_steps=2")
        code, stdout, stderr = finish(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                       text=True), [])
        assert code == 1 and "Traceback" not in stderr
        [line] = errors(stderr)
        assert line.startswith(f"Error: writing to {out} failed (no space left on device); ")
        assert line.endswith(f" free; the newest complete checkpoint is {out / 'checkpoint-4'}: make room, then run "
                             f"again with --resume auto --output-dir {out}")
        assert incomplete_reason(out / "checkpoint-6") is not None
        written = json.loads((out / "checkpoint-4" / MANIFEST).read_text())["files"]
        run = resolve(RunRequest("rloo", str(RECIPES / "rloo" / "smoke.yaml"), planning=True), cuda=False)
        saved = sum(entry["size"] for entry in written.values())
        assert abs(plan_run(run).checkpoint_bytes / saved - 1) < 0.1  # the space warning's estimate

        subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)  # room made
        # ... and the job comes back on 1 process: the 2-process checkpoint's shards are re-split
        code, stdout, stderr = finish(subprocess.Popen(argv + ["--resume", "auto", "--num-processes", "1"],
                                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), [])
        assert code == 0
        assert f"--resume auto: continuing from {out / 'checkpoint-4'}" in stderr
        state = json.loads((out / "trainer_state.json").read_text())
        assert state["global_step"] == 6 and [entry["step"] for entry in state["log_history"] if "kl" in entry] == \
            list(range(1, 7))
        assert_resumed_on_fewer_processes(out, stderr, 4, "kl")
    finally:
        subprocess.run(["umount", "--lazy", str(disk)])
