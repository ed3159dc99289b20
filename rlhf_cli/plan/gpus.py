"""How much memory each process may use: given by the user, asked of nvidia-smi, or this machine's RAM.

No torch: `nvidia-smi` answers in a few milliseconds and needs no CUDA initialisation.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


class SizeError(ValueError):
    """A memory size that cannot be read; the message says what is expected."""


def parse_size(value: str | int) -> int:
    """Bytes from `24GiB`, `24GB`, `24576MiB` or a plain number of bytes."""
    if isinstance(value, bool):
        raise SizeError(f"{value!r} is not a memory size; write e.g. 24GiB, 24GB, 24576MiB or bytes")
    if isinstance(value, int):
        number, unit = float(value), ""
    else:
        match = SIZE.match(str(value))
        if not match or match.group(2).lower() not in UNITS:
            raise SizeError(f"{value!r} is not a memory size; write e.g. 24GiB, 24GB, 24576MiB or bytes")
        number, unit = float(match.group(1)), match.group(2).lower()
    if unit in ("", "b") and number != int(number):
        raise SizeError(f"{value!r}: a plain number is bytes and must be whole; write e.g. 23.7GiB")
    if number <= 0:
        raise SizeError(f"{value!r}: a memory size must be positive")
    return int(number * UNITS[unit])


@dataclass(frozen=True)
class Hardware:
    """Memory one process (GPU) may use, the machine layout, and where the number came from."""

    gpu_memory: int
    gpus_per_machine: int
    machines: int
    source: str

    @property
    def total_gpus(self) -> int:
        return self.gpus_per_machine * self.machines


def nvidia_smi(fields: str) -> list[list[str]]:
    """`nvidia-smi --query-gpu=FIELDS`: one row of values per GPU; empty without nvidia-smi or when it fails."""
    command = shutil.which("nvidia-smi")
    if command is None:
        return []
    try:
        done = subprocess.run([command, f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=20, check=True)
    except (OSError, subprocess.SubprocessError):
        return []
    return [[value.strip() for value in line.split(",")] for line in done.stdout.splitlines() if line.strip()]


def nvidia_gpu_memory() -> list[int]:
    """Total memory of each NVIDIA GPU on this machine in bytes; empty without nvidia-smi or GPUs."""
    return [int(float(row[0])) * 2**20 for row in nvidia_smi("memory.total")]


def available_ram(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def gib(value: int) -> str:
    return f"{value / 2**30:.1f} GiB"


def detect_hardware(gpu_memory: int | None, processes: int, machines: int) -> Hardware | str:
    """The hardware to plan against, or why it cannot be known."""
    per_machine = max(1, processes // max(1, machines))
    if gpu_memory is not None:
        return Hardware(gpu_memory, per_machine, machines, f"given: {gib(gpu_memory)} per GPU")
    gpus = nvidia_gpu_memory()
    if gpus:
        return Hardware(min(gpus), per_machine, machines, f"nvidia-smi: {len(gpus)} GPU(s), smallest {gib(min(gpus))}")
    ram = available_ram()
    if ram is None:
        return "no GPU found and no MemAvailable in /proc/meminfo; pass --gpu-memory"
    return Hardware(ram // per_machine, per_machine, machines,
                    f"no GPU here: this machine's available RAM ({gib(ram)}) shared by {per_machine} process(es)")
