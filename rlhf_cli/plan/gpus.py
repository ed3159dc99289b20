"""How much memory each process may use: given by the user, asked of nvidia-smi, or this machine's RAM.

No torch: `nvidia-smi` answers in a few milliseconds and needs no CUDA initialisation.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

from rlhf_cli.sizes import gib, meminfo


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


def available_ram() -> int | None:
    return meminfo("MemAvailable")


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
