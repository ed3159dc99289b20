"""`accelerate launch`, passing SIGUSR1 on to the ranks and ending with an exit code, not a traceback.

When a rank fails, that rank has already printed its error once (see rlhf_cli.rank.lifecycle);
accelerate and torch's elastic agent would add two more tracebacks saying only that it failed.
Usage is exactly accelerate's: `python -m rlhf_cli.launch.agent [accelerate launch args]`.
"""

from __future__ import annotations

import subprocess
import sys


def _exit_code(code: int) -> int:
    return 128 - code if code < 0 else code  # a rank killed by signal N: 128+N, as a shell reports it


def main(argv: list[str]) -> int:
    from accelerate.commands.launch import launch_command, launch_command_parser

    from rlhf_cli import compat

    signal_stopped, rank_failed = compat.launch_errors()
    args = launch_command_parser().parse_args(argv)
    # torch's agent passes the signals it handles on to the ranks, which checkpoint on SIGTERM and SIGUSR1;
    # any other signal kills the agent itself.
    compat.forward_signals_to_ranks(args, "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1")
    try:
        launch_command(args)
    except rank_failed as failed:
        return _exit_code(compat.first_failure_exitcode(failed)) or 1
    except signal_stopped as stopped:
        return 128 + int(stopped.sigval)
    except subprocess.CalledProcessError as failed:
        return _exit_code(failed.returncode) or 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
