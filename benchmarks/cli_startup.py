"""CLI start-up: CPU time (user + sys) of `rlhf --help` and every subcommand's `--help` against `trl --help`.

Each rlhf command is run right after a `trl --help`, `--repeats` pairs each, interleaved in one run of this
script, so that a machine shared with other work slows both sides of a pair alike; the table gives the median of
each side and the median of the per-pair ratios. CPU time, not wall time: what the command itself costs.

    python benchmarks/cli_startup.py [--repeats 10] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
from pathlib import Path

from _common import REPO, RESULTS, markdown_table, print_table, write_markdown
from launcher import console_script

COMMANDS = ("--help", "ppo --help", "rloo --help", "online-dpo --help", "grpo --help", "plan --help",
            "plan rloo --help", "recipes --help", "init --help", "doctor --help", "report --help")


def cpu_seconds(argv: list[str]) -> float:
    """User + sys seconds of one run of `argv` (our code first on the path), its output discarded."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=10, help="interleaved pairs per command")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    rlhf, trl = console_script("rlhf"), console_script("trl")
    pairs: dict[str, list[tuple[float, float]]] = {command: [] for command in COMMANDS}
    for _ in range(args.repeats):
        for command in COMMANDS:
            reference = cpu_seconds([trl, "--help"])
            pairs[command].append((cpu_seconds([rlhf, *command.split()]), reference))
    columns = ["command", "rlhf CPU s (median)", "trl --help CPU s (median)", "ratio (median of pairs)"]
    rows = [[f"rlhf {command}", f"{statistics.median(a for a, _ in found):.3f}",
             f"{statistics.median(b for _, b in found):.3f}", f"{statistics.median(a / b for a, b in found):.2f}"]
            for command, found in pairs.items()]
    title = f"CLI start-up: user+sys CPU seconds, {args.repeats} interleaved pairs per command"
    print_table(title, columns, rows)
    write_markdown(args.out / "cli_startup.md", f"# {title}\n\n{markdown_table(columns, rows)}")


if __name__ == "__main__":
    main()
