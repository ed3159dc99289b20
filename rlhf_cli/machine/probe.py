"""What this machine has, asked without torch: its NVIDIA GPUs (nvidia-smi), CUDA devices, memory and free disk.

A leaf: resolution asks whether CUDA is present, the plan sizes memory, the launcher checks free disk, and
`rlhf doctor` lists the GPUs, all from here.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


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


def cuda_present() -> bool:
    """Whether this machine has an NVIDIA GPU, asked without importing torch."""
    return any(Path(p).exists() for p in ("/dev/nvidiactl", "/dev/nvidia0", "/proc/driver/nvidia/version"))


def meminfo(field: str, path: Path = Path("/proc/meminfo")) -> int | None:
    """A `/proc/meminfo` field (MemTotal, MemAvailable) in bytes; None where there is none."""
    try:
        for line in path.read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def available_ram() -> int | None:
    return meminfo("MemAvailable")


def existing(path: Path) -> Path:
    """`path`, or the nearest directory above it that exists (an output dir not created yet)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_space(path: Path) -> int | None:
    """Free bytes on the disk that holds `path` (or would, once created); None where it cannot be asked."""
    try:
        return shutil.disk_usage(existing(path)).free
    except OSError:
        return None


def process_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks since boot) of process `pid`, from /proc (Linux): the one reader of a
    process's stat line. A reused pid has another start time. None when there is no such process or no /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()  # the command name, in parentheses, may hold spaces
    return (fields[0], int(fields[19])) if len(fields) > 19 else None
