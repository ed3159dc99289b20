"""The test suite as CI runs it (`python -m pytest`, .ci/run), timed per test file, with every launch counted.

A launch (a process of `rlhf ppo|rloo|grpo|online-dpo` or `rlhf vllm-serve` started by a test) is the suite's unit
of cost: a 2-step run is 15-20 s on 2 cores, most of it the start-up of five processes. Per file: its seconds (every
test's setup, call and teardown, as pytest measures them), its tests, its launches and their wall seconds; the
five slowest files first. Extra arguments go to pytest (`-- tests/launch -m conformance`); the default is the whole
suite, as CI runs it (about half an hour on 2 cores).

    python benchmarks/suite.py [--out benchmarks/results] [-- PYTEST ARGS]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from _common import REPO, RESULTS, markdown_table, print_table, write_markdown

COLUMNS = ("test file", "seconds", "tests", "launches", "launch seconds")


def per_file(records: list[dict]) -> dict[str, dict[str, float]]:
    """The probe's records summed per test file."""
    files: dict[str, dict[str, float]] = defaultdict(lambda: dict.fromkeys(COLUMNS[1:], 0.0))
    for record in records:
        path = record["test"].split("::")[0]
        if "launch" in record:
            files[path]["launches"] += 1
            files[path]["launch seconds"] += record["seconds"]
        else:
            files[path]["seconds"] += record["seconds"]
            files[path]["tests"] += record["phase"] == "call"
    return files


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("pytest_args", nargs="*", help="after --: what pytest gets (default: the whole suite)")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        log = Path(work) / "probe.jsonl"
        log.touch()
        env = {**os.environ, "SUITE_PROBE_LOG": str(log),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]))}
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "pytest", "-p", "_suite_probe", *options.pytest_args], cwd=REPO,
                              env=env)
        wall = time.monotonic() - started
        records = [json.loads(line) for line in log.read_text().splitlines()]
    files = sorted(per_file(records).items(), key=lambda item: -item[1]["seconds"])
    rows = [[path, f"{row['seconds']:.0f}", f"{row['tests']:.0f}", f"{row['launches']:.0f}",
             f"{row['launch seconds']:.0f}"] for path, row in files]
    launches = sum(row["launches"] for _, row in files)
    title = (f"`python -m pytest {' '.join(options.pytest_args)}`: {wall:.0f} s ({wall / 60:.1f} min) wall, "
             f"{launches:.0f} launches, exit code {done.returncode}")
    print_table(title, COLUMNS, rows)
    write_markdown(options.out / "suite.md", f"# The test suite, timed per file\n\n{title}\n\n"
                   f"{markdown_table(COLUMNS, rows)}")


if __name__ == "__main__":
    main()
