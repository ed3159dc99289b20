"""`accelerate launch`, passing SIGUSR1 on to the ranks and ending with an exit code, not a traceback.

When ranks fail, accelerate and torch's elastic agent would print two tracebacks saying only that they failed.
Instead the supervisor writes down what only it knows, how each failed rank ended (an exit code, or the signal that
killed it), with this machine's memory, into `ranks/machine-N.exits.json`, and raises the first-failure marker
so that the ranks of other machines stop too; the launcher reads it to name the real cause.
Usage is exactly accelerate's: `python -m rlhf_cli.launch.supervisor [accelerate launch args]`.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from rlhf_cli.launch.faults import machine_memory
from rlhf_cli.output.files import claim, try_write_json
from rlhf_cli.output.run_dir import (
    FAILED,
    OUTPUT_MODE_ENV,
    RUN_DIR_ENV,
    START_GATE,
    START_GATE_ENV,
    RunDir,
    signal_exit_code,
)


def _exit_code(code: int) -> int:
    return signal_exit_code(-code) if code < 0 else code  # a rank killed by signal N


def record_exits(machine_rank: int, exits: list[dict[str, Any]]) -> None:
    """What the launcher cannot learn from a rank that was killed; nothing when the output dir is unknown or full."""
    if not os.environ.get(RUN_DIR_ENV):
        return
    run_dir = RunDir(Path(os.environ[RUN_DIR_ENV]))
    try_write_json(run_dir.rank_exits(machine_rank), {"machine_rank": machine_rank, "host": socket.gethostname(),
                                                      "memory": machine_memory(), "exits": exits})
    claim(run_dir.first_failure, FAILED)


def gate_opens() -> bool:
    """Wait for the launcher's go: it opens the gate once the pre-launch check passed and the run's files are
    written, or closes it (the check failed, the launcher stopped), and then no rank may start."""
    gate = os.environ.get(START_GATE_ENV)
    if gate is None:  # launch.sh, or accelerate's own use: nothing to wait for
        return True
    with os.fdopen(int(gate), "rb") as pipe:
        return pipe.read(len(START_GATE)) == START_GATE


def main(argv: list[str]) -> int:
    from accelerate.commands.launch import launch_command, launch_command_parser

    from rlhf_cli.compat import launcher

    signal_stopped, rank_failed = launcher.launch_errors()
    if os.environ.get(OUTPUT_MODE_ENV) != "verbose":
        # "Sending process N closing signal SIGTERM", "failed (exitcode: -9) local_rank: 1": the launcher says what
        # happened, once, from what this supervisor records.
        logging.getLogger("torch.distributed.elastic.multiprocessing.api").setLevel(logging.CRITICAL)
    args = launch_command_parser().parse_args(argv)
    # torch's agent passes the signals it handles on to the ranks, which checkpoint on SIGTERM and SIGUSR1;
    # any other signal kills the supervisor itself.
    launcher.forward_signals_to_ranks(args, "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1")
    launcher.keep_working_directory_off_rank_path()  # a user's logging.py there must not replace the stdlib's
    if not gate_opens():
        return 0
    try:
        launch_command(args)
    except rank_failed as failed:
        record_exits(int(args.machine_rank or 0), launcher.rank_exits(failed))
        return 1  # a rank failed, whether it raised or was killed; the launcher says which and how
    except signal_stopped as stopped:
        return signal_exit_code(int(stopped.sigval))
    except subprocess.CalledProcessError as failed:
        return _exit_code(failed.returncode) or 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
