"""How much memory each process may use: given by the user, asked of nvidia-smi, or this machine's RAM.

No torch: `nvidia-smi` answers in a few milliseconds and needs no CUDA initialisation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rlhf_cli.machine.calibration import as_gpu, remembered
from rlhf_cli.machine.gpus import Gpu, HardwareError, detected, from_file, named, with_interconnect, with_network
from rlhf_cli.machine.probe import available_ram, nvidia_gpu_memory
from rlhf_cli.sizes import gib


@dataclass(frozen=True)
class Hardware:
    """Memory one process (GPU) may use, the machine layout, and where the number came from."""

    gpu_memory: int
    gpus_per_machine: int
    machines: int
    source: str
    gpu: Gpu | None = None  # its rates, for the time plan; None: no GPU known (pass --gpu)
    gpu_source: str = ""
    corrections: Mapping[str, float] = field(default_factory=dict)  # a rehearsal's measured / planned, per phase

    @property
    def this_machine(self) -> bool:
        """The GPU timed is this machine's (nvidia-smi's or calibrated here), not one named for another."""
        return self.gpu is not None and not self.gpu_source.startswith(("given", "--hardware"))

    @property
    def total_gpus(self) -> int:
        return self.gpus_per_machine * self.machines


def detect_hardware(gpu_memory: int | None, processes: int, machines: int, source: str | None = None) -> Hardware | str:
    """The hardware to plan against, or why it cannot be known; `source` says where a given memory came from."""
    per_machine = max(1, processes // max(1, machines))
    if gpu_memory is not None:
        return Hardware(gpu_memory, per_machine, machines, source or f"given: {gib(gpu_memory)} per GPU")
    gpus = nvidia_gpu_memory()
    if gpus:
        return Hardware(min(gpus), per_machine, machines, f"nvidia-smi: {len(gpus)} GPU(s), smallest {gib(min(gpus))}")
    ram = available_ram()
    if ram is None:
        return "no GPU found and no MemAvailable in /proc/meminfo; pass --gpu-memory"
    return Hardware(ram // per_machine, per_machine, machines,
                    f"no GPU here: this machine's available RAM ({gib(ram)}) shared by {per_machine} process(es)")


def detect_gpu(name: str | None, hardware_file: str | None, interconnect: str | None,
               network: str | None = None, processes_per_machine: int = 1) -> tuple[Gpu | None, str]:
    """The GPU to time the run on: `--hardware FILE`, `--gpu NAME`, else nvidia-smi's, else this machine's
    calibration when one is remembered (`rlhf doctor --calibrate`); `--interconnect` and `--network` on top.
    Resolution has checked the names (rlhf_cli/config/run_checks.py), so only nvlink on a GPU without it fails
    here, and then the GPU's own link stays."""
    if hardware_file is not None:
        gpu, source = from_file(Path(hardware_file)), f"--hardware {hardware_file}"
    elif name is not None:
        gpu, source = named(name), f"given: {name}"
    else:
        gpu, source = detected()
        calibration = remembered() if gpu is None else None
        if calibration is not None:
            gpu, source = as_gpu(calibration, processes_per_machine), calibration.describe()
    if gpu is not None and interconnect is not None:
        try:
            gpu, source = with_interconnect(gpu, interconnect), f"{source}, interconnect {interconnect}"
        except HardwareError as error:
            source = f"{source}; {error}"
    if gpu is not None and network is not None:
        gpu, source = with_network(gpu, network), f"{source}, network {network}"
    return gpu, source
