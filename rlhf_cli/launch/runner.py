"""Start a resolved run: write its record, start the ranks, pass signals on, and say how it ended."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rlhf_cli.config.run import ResolvedRun
from rlhf_cli.errors import OutputDirError
from rlhf_cli.launch.command import launch_command, launch_script, machine_rank, run_files_dir
from rlhf_cli.launch.faults import Failure, PlanNeeds, explain
from rlhf_cli.launch.prelaunch import PendingCheck
from rlhf_cli.launch.versions import installed_versions
from rlhf_cli.machine.probe import free_space
from rlhf_cli.output.files import read_json, try_write_json, write_atomic
from rlhf_cli.output.lock import LockHeld, acquire, release
from rlhf_cli.output.ownership import holdings, listing, record_end, record_start, remove_owned
from rlhf_cli.output.run_dir import (
    EXIT_PREEMPTED,
    PLANNED_SAVE_ENV,
    PLANNED_STEP_ENV,
    RECIPE_HEADER,
    START_GATE,
    START_GATE_ENV,
    RunDir,
    signal_exit_code,
)
from rlhf_cli.sizes import readable

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
UNKNOWN = PlanNeeds()  # no plan: a failure is explained without its numbers


@dataclass(frozen=True)
class Outcome:
    """How the ranks ended, read from what they left in the output dir."""

    exit_code: int
    status: str  # finished | preempted | failed | interrupted
    summary: dict[str, Any] | None = None  # summary.json
    failure: Failure | None = None  # why the ranks failed (rlhf_cli.launch.faults)
    preempted: dict[str, Any] | None = None  # preempted.json
    wall_seconds: float = 0.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def write_run_files(run: ResolvedRun, accelerate: dict[str, Any], verbosity: str = "normal") -> None:
    """The resolved recipe, the accelerate config and launch.sh, in the output dir, before any rank starts."""
    files = run_files_dir(run)
    header = f"{RECIPE_HEADER}{run.recipe or 'flags'}; a valid recipe for `rlhf {run.algorithm}`.\n"
    shared = {key: value for key, value in accelerate.items() if key != "machine_rank"}
    try:
        if machine_rank(run) == 0:  # before anything else: whatever appears from now on is the run's
            record_start(files, [files.recipe, files.accelerate_config, files.launch_script, files.run_record,
                                 files.path / "machines"])
        write_atomic(files.recipe, header + yaml.safe_dump(run.recipe_values(), sort_keys=True))
        write_atomic(files.accelerate_config, yaml.safe_dump(shared, sort_keys=True))
        write_atomic(files.launch_script, launch_script(launch_command(run, verbosity=verbosity), Path.cwd()))
        files.launch_script.chmod(0o755)
    except OSError as error:
        free = free_space(files.path)
        raise OutputDirError(f"cannot write to the output dir {files.path}: {(error.strerror or str(error)).lower()} "
                             f"({readable(free) if free is not None else 'unknown'} free); choose another "
                             "--output-dir, or make room") from None


def _remove_earlier_run(run_dir: RunDir) -> None:
    """`--overwrite`: what earlier runs wrote goes, before this run writes anything."""
    try:
        remove_owned(run_dir)
    except OSError as error:
        raise OutputDirError(f"--overwrite: cannot remove the earlier run's files in {run_dir.path}: "
                             f"{(error.strerror or str(error)).lower()}; remove them yourself or choose another "
                             "--output-dir") from None


def _hold_output_dir(run: ResolvedRun) -> Path | None:
    """Machine rank 0's launcher holds the output dir from before it writes anything until the run has ended: a
    second launch into it stops here (or at its own check), naming this one. The directory must still hold what
    the run's check saw: another run may have written there between the check and the lock."""
    if machine_rank(run) != 0:
        return None
    try:
        lock = acquire(run.output_dir)
    except LockHeld as held:
        raise OutputDirError(held.holder.problem("--output-dir")) from None
    except OSError as error:
        raise OutputDirError(f"cannot write to the output dir {run.output_dir}: "
                             f"{(error.strerror or str(error)).lower()}; choose another --output-dir") from None
    now = holdings(run.output_dir).entries
    if run.output_dir_entries is not None and now != run.output_dir_entries:
        release(lock)
        raise OutputDirError(f"--output-dir: output dir {run.output_dir} changed while the run was being checked "
                             f"(it now holds {listing(now) or 'nothing'}); another run wrote there: look, then run "
                             "again")
    return lock


def _run_record(run: ResolvedRun, accelerate: dict[str, Any]) -> dict[str, Any]:
    return {
        "command": [Path(sys.argv[0]).name, *sys.argv[1:]],
        "cwd": str(Path.cwd()),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "launcher_host": socket.gethostname(),
        "versions": installed_versions(),
        "layout": {key: accelerate.get(key) for key in
                   ("num_machines", "num_processes", "main_process_ip", "main_process_port")},
    }


def _clear_previous_outcome(run_dir: RunDir) -> None:
    """A resumed run reuses the output dir: the last attempt's ending must not be read as this one's."""
    for stale in (run_dir.preempted, run_dir.summary, *run_dir.attempt_files()):
        stale.unlink(missing_ok=True)


def outcome(run_dir: RunDir, code: int, signals: list[int], wall_seconds: float, needs: PlanNeeds = UNKNOWN) -> Outcome:
    summary, preempted = read_json(run_dir.summary), read_json(run_dir.preempted)
    if preempted is not None:
        return Outcome(EXIT_PREEMPTED, "preempted", summary, None, preempted, wall_seconds)
    if code == 0:
        return Outcome(0, "finished", summary, None, None, wall_seconds)
    failure = explain(run_dir, needs)
    if signals and failure is None:
        return Outcome(code, "interrupted", summary, None, None, wall_seconds)
    failure = failure or Failure(f"the ranks exited with code {code} without recording an error; see the output above "
                                 f"and the ranks' logs ({run_dir.ranks}/rank-N.log)")
    return Outcome(code, "failed", summary, failure, None, wall_seconds)


def launch(run: ResolvedRun, verbosity: str = "normal", needs: PlanNeeds = UNKNOWN, overwrite: bool = False) -> Outcome:
    """Run this machine's ranks to the end; signals are passed on to them. Says how they ended; `needs` (from the
    plan) makes a failure's explanation more precise; `overwrite` first removes what earlier runs wrote there."""
    created = _missing_dirs(run.output_dir)
    lock = _hold_output_dir(run)
    try:
        return _launch_held(run, verbosity, needs, overwrite)
    finally:
        if lock is not None:
            release(lock)
        for directory in created:  # a run stopped before it wrote anything leaves no empty dir behind
            if directory.is_dir() and not any(directory.iterdir()):
                directory.rmdir()


def _missing_dirs(directory: Path) -> list[Path]:
    """The directories up to `directory` that do not exist yet, deepest first: the ones the lock will create."""
    missing = []
    while not directory.exists() and directory != directory.parent:
        missing.append(directory)
        directory = directory.parent
    return missing


def _plan_env(needs: PlanNeeds) -> dict[str, str]:
    """What the ranks take from the plan for the progress line's ETA: a save's seconds, counted until the run has
    measured a save of its own, and the step phases' seconds, weighed against the steps it has measured."""
    env = {PLANNED_SAVE_ENV: f"{needs.save_seconds:.6g}"} if needs.save_seconds is not None else {}
    if needs.step_seconds is not None:
        env[PLANNED_STEP_ENV] = json.dumps(needs.step_seconds)
    return env


def _launch_held(run: ResolvedRun, verbosity: str, needs: PlanNeeds, overwrite: bool) -> Outcome:
    """`launch`, once this machine's launcher holds the output dir (or, on another machine, needs not)."""
    accelerate = dict(run.accelerate)
    if int(accelerate.get("num_machines") or 1) == 1 and not accelerate.get("main_process_port"):
        accelerate["main_process_port"] = _free_port()  # two runs on one node must not collide
    run_dir = RunDir(run.output_dir)
    command = launch_command(run, verbosity=verbosity)
    started = time.monotonic()
    # The pre-launch check and the launch supervisor's imports (torch, accelerate) run at once: the supervisor waits
    # at a gate and starts no rank before the check has passed and the run's files are written.
    checking = PendingCheck(run)
    gate_read, gate_write = os.pipe()
    # The ranks get their own process group, so a terminal's Ctrl-C reaches them once, through us.
    # torch's launcher sets one OpenMP thread per rank anyway, with a banner; keep a user's own choice.
    env = {"OMP_NUM_THREADS": "1", **os.environ, **command.env, START_GATE_ENV: str(gate_read), **_plan_env(needs)}
    ranks = subprocess.Popen(command.argv, env=env, start_new_session=True, pass_fds=(gate_read,))
    os.close(gate_read)
    received: list[int] = []
    gate_open = False

    def forward(signum: int, _frame: Any) -> None:
        if not gate_open:  # no rank has started: stop here, as Ctrl-C does, with nothing written
            raise KeyboardInterrupt
        received.append(signum)
        # A second Ctrl-C means "stop now"; SIGTERM and SIGUSR1 ask the ranks to checkpoint and stop.
        interrupts = received.count(signal.SIGINT)
        os.killpg(ranks.pid, signal.SIGKILL if signum == signal.SIGINT and interrupts > 1 else signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED_SIGNALS}
    try:
        try:
            checking.wait()
            if overwrite and machine_rank(run) == 0:
                _remove_earlier_run(run_dir)
            write_run_files(run, accelerate, verbosity)
            if machine_rank(run) == 0:
                _clear_previous_outcome(run_dir)
                try_write_json(run_dir.run_record, _run_record(run, accelerate))
        except BaseException:
            os.killpg(ranks.pid, signal.SIGKILL)  # only the supervisor so far: no rank has started
            ranks.wait()
            raise
        gate_open = True
        try:
            os.write(gate_write, START_GATE)
        except BrokenPipeError:
            pass  # the supervisor ended before the gate opened: its exit code and output say why
        code = ranks.wait()
    finally:
        os.close(gate_write)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    code = signal_exit_code(-code) if code < 0 else code
    result = outcome(run_dir, code, received, time.monotonic() - started, needs)
    if machine_rank(run) == 0:
        _record_the_end(run_dir, result)
    return result


def _record_the_end(run_dir: RunDir, result: Outcome) -> None:
    """How the run ended, in run.json beside every rank's record, and the run's files marked finished."""
    record = read_json(run_dir.run_record) or {}
    processes = (record.get("layout") or {}).get("num_processes")
    ranks = [read_json(path) for path in run_dir.rank_records()]  # a resume on fewer processes leaves the others'
    record.update(finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"), status=result.status,
                  exit_code=result.exit_code, wall_seconds=round(result.wall_seconds, 1),
                  ranks=[rank for rank in ranks if not (processes and rank and rank.get("rank", 0) >= processes)])
    try_write_json(run_dir.run_record, record)  # on a full disk the error line says it all
    try:
        record_end(run_dir)
    except OSError:
        pass  # the record still says `running`: every entry counts as the run's, which they are
