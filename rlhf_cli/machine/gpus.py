"""The GPUs people train on, as the time plan needs them: dense bf16 FLOP/s, memory bandwidth, the link between GPUs
and the link to the host; chosen from nvidia-smi's name, `--gpu NAME`, or `--hardware FILE`, `--interconnect` for
the link between GPUs. A leaf: resolution checks the names, the plan reads the rates. No torch.

Every rate is the vendor's peak: dense (no 2:4 sparsity), bf16 with fp32 accumulation, bytes per second in one
direction per GPU. How much of it a phase reaches is the plan's assumption (rlhf_cli/plan/time.py).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from rlhf_cli.machine.probe import nvidia_smi
from rlhf_cli.sizes import SizeError, parse_size

TERA, GB = 10**12, 10**9
NVLINK, PCIE = "nvlink", "pcie"
# PCI-SIG: 16 GT/s (Gen4) and 32 GT/s (Gen5) per lane, 128b/130b encoding, 16 lanes: 31.5 and 63 GB/s each way
PCIE_GEN4, PCIE_GEN5 = int(31.5 * GB), 63 * GB
# Between machines, bytes/s each way per GPU, by class of machine (`--network RATE` overrides):
# NVIDIA DGX A100 datasheet: 8 single-port ConnectX-6 200 Gb/s HDR InfiniBand for 8 GPUs, one per GPU
NETWORK = 25 * GB
NETWORK_SOURCE = "DGX A100: one 200 Gb/s InfiniBand port per GPU"
# NVIDIA DGX H100 / H200 / B200 datasheets: 8 single-port ConnectX-7 400 Gb/s NDR for 8 GPUs
NETWORK_NDR = 50 * GB
NETWORK_NDR_SOURCE = "DGX H100/H200/B200: one 400 Gb/s ConnectX-7 port per GPU"
# AWS g5.48xlarge (8 A10G) and g6.48xlarge (8 L4): 100 Gb/s for the machine, shared by its 8 GPUs
NETWORK_CLOUD = 100e9 / 8 / 8
NETWORK_CLOUD_SOURCE = "a PCIe server's 100 Gb/s Ethernet shared by 8 GPUs (AWS g5.48xlarge)"
# A workstation's 10 Gb/s Ethernet shared by 4 cards (assumed)
NETWORK_WORKSTATION = 10e9 / 8 / 4
NETWORK_WORKSTATION_SOURCE = "a workstation's 10 Gb/s Ethernet shared by 4 cards (assumed)"


# NCCL's ring all-gather reaches about 75% of a link's rate each way (nccl-tests' bus bandwidth on NVLink;
# assumed for PCIe as well)
COLLECTIVE_EFFICIENCY = 0.75


class HardwareError(ValueError):
    """A GPU name, interconnect or hardware file that cannot be read; the message names the fix."""


@dataclass(frozen=True)
class Gpu:
    """One GPU's peak rates and links."""

    name: str
    bf16_flops: float  # dense bf16 tensor FLOP/s, fp32 accumulation
    memory_bandwidth: float  # bytes/s of its memory
    interconnect: str  # nvlink or pcie: how GPUs of one machine reach each other
    interconnect_bandwidth: float  # bytes/s each way per GPU over that link
    host_bandwidth: float  # bytes/s each way between the GPU and CPU memory (PCIe)
    memory: int = 0  # bytes, as sold (the plan's memory: --gpu-memory, else this for --gpu NAME, else nvidia-smi)
    network: float = NETWORK  # bytes/s each way per GPU between machines
    network_source: str = NETWORK_SOURCE
    fetch_latency: float | None = None  # seconds ZeRO-3 pays per module fetched, when measured (else assumed)
    call_latency: float | None = None  # seconds of a small module's call from Python, when measured (else assumed)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _pcie(name: str, flops: float, bandwidth: float, memory_gb: int, host: int = PCIE_GEN4, peer: bool = True) -> Gpu:
    """A PCIe card; without peer-to-peer (`peer` False: GeForce cards, whose drivers turn it off) NCCL stages every
    transfer through host memory, crossing PCIe twice: half the rate between GPUs. Between machines a data-centre
    card shares a server's Ethernet, a GeForce card a workstation's."""
    network = (NETWORK_CLOUD, NETWORK_CLOUD_SOURCE) if peer else (NETWORK_WORKSTATION, NETWORK_WORKSTATION_SOURCE)
    return Gpu(name, flops, bandwidth, PCIE, host if peer else host / 2, host, memory_gb * GB, *network)


def _nvlink(name: str, flops: float, bandwidth: float, memory_gb: int, link: float, host: int,
            network: tuple[float, str] = (NETWORK, NETWORK_SOURCE)) -> Gpu:
    return Gpu(name, flops, bandwidth, NVLINK, link, host, memory_gb * GB, *network)


GPUS = {
    # NVIDIA A10 datasheet: BF16 Tensor Core 125 TF (250 with sparsity), 600 GB/s GDDR6, PCIe Gen4
    "a10": _pcie("A10", 125 * TERA, 600 * GB, 24),
    # NVIDIA L4 datasheet: BF16 Tensor Core 242 TF with sparsity (121 dense), 300 GB/s, PCIe Gen4
    "l4": _pcie("L4", 121 * TERA, 300 * GB, 24),
    # NVIDIA L40S datasheet: BF16 Tensor Core 362 TF (733 with sparsity), 864 GB/s, PCIe Gen4, no NVLink
    "l40s": _pcie("L40S", 362 * TERA, 864 * GB, 48),
    # NVIDIA Ampere GA102 whitepaper, RTX 3090: BF16 Tensor with FP32 accumulate 71 TF (142 sparse), 936 GB/s;
    # PCIe Gen4 (an NVLink bridge joins two cards at most: pass --interconnect nvlink or a rate)
    "rtx3090": _pcie("RTX 3090", 71 * TERA, 936 * GB, 24, peer=False),
    # NVIDIA Ada Lovelace whitepaper, RTX 4090: BF16 Tensor with FP32 accumulate 165.2 TF (330.4 sparse),
    # 1008 GB/s, PCIe Gen4, no NVLink
    "rtx4090": _pcie("RTX 4090", 165.2 * TERA, 1008 * GB, 24, peer=False),
    # NVIDIA A100 datasheet: BF16 Tensor Core 312 TF (624 sparse); 40GB SXM 1555 GB/s, 80GB SXM 2039 GB/s,
    # 80GB PCIe 1935 GB/s; NVLink 3 600 GB/s (300 each way) on SXM; PCIe Gen4
    "a100-40gb": _nvlink("A100 40GB", 312 * TERA, 1555 * GB, 40, 300 * GB, PCIE_GEN4),
    "a100-80gb": _nvlink("A100 80GB", 312 * TERA, 2039 * GB, 80, 300 * GB, PCIE_GEN4),
    "a100-pcie": _pcie("A100 PCIe", 312 * TERA, 1935 * GB, 80),
    # NVIDIA H100 datasheet: SXM BF16 989 TF (1979 sparse), 3.35 TB/s, NVLink 4 900 GB/s (450 each way), PCIe Gen5;
    # PCIe card 756 TF, 2.0 TB/s
    "h100": _nvlink("H100 SXM", 989 * TERA, 3350 * GB, 80, 450 * GB, PCIE_GEN5,
                     (NETWORK_NDR, NETWORK_NDR_SOURCE)),
    "h100-pcie": _pcie("H100 PCIe", 756 * TERA, 2000 * GB, 80, PCIE_GEN5),
    # NVIDIA H200 datasheet: SXM BF16 989 TF (1979 sparse), 4.8 TB/s, 141 GB, NVLink 900 GB/s, PCIe Gen5
    "h200": _nvlink("H200", 989 * TERA, 4800 * GB, 141, 450 * GB, PCIE_GEN5,
                     (NETWORK_NDR, NETWORK_NDR_SOURCE)),
    # NVIDIA HGX B200 datasheet: BF16 Tensor Core 4.5 PF with sparsity (2.25 dense); DGX B200: 64 TB/s of HBM3e
    # over 8 GPUs (8 TB/s each); NVLink 5 1.8 TB/s (900 GB/s each way); PCIe Gen5
    "b200": _nvlink("B200", 2250 * TERA, 8000 * GB, 180, 900 * GB, PCIE_GEN5,
                     (NETWORK_NDR, NETWORK_NDR_SOURCE)),
}
ALIASES = {"3090": "rtx3090", "4090": "rtx4090", "a100": "a100-80gb", "a100-40": "a100-40gb",
           "a100-80": "a100-80gb", "h100-sxm": "h100"}


def _key(name: str) -> str:
    """`NVIDIA GeForce RTX 3090` -> `rtx3090`; `A100 80GB` -> `a100-80gb`: lower case, vendor words dropped."""
    words = re.sub(r"\b(nvidia|geforce|tesla)\b", " ", name.lower())
    words = re.sub(r"\brtx\s+", "rtx", words)
    return "-".join(re.findall(r"[a-z0-9]+", words))


def named(name: str) -> Gpu:
    """The table's GPU for `--gpu NAME` (a10, l4, l40s, rtx3090, rtx4090, a100-40gb, a100-80gb, a100-pcie, h100,
    h100-pcie, h200, b200, or nvidia-smi's spelling)."""
    key = _key(name)
    key = ALIASES.get(key, key)
    if key in GPUS:
        return GPUS[key]
    raise HardwareError(f"unknown GPU {name!r}; known: {', '.join(GPUS)}; describe another with --hardware FILE")


def from_smi_name(name: str, memory_bytes: int) -> Gpu | None:
    """The table's GPU for a name as nvidia-smi reports it (`NVIDIA A100-SXM4-80GB`, `NVIDIA H100 80GB HBM3`,
    `NVIDIA GeForce RTX 4090`); None when it is not in the table."""
    key = _key(name)
    if key.startswith("a100"):
        return GPUS["a100-pcie" if "pcie" in key else "a100-40gb" if memory_bytes < 60 * 2**30 else "a100-80gb"]
    words = key.split("-")
    for candidate in sorted(GPUS, key=len, reverse=True):  # h100-pcie before h100, l40s before l4
        base, _, variant = candidate.partition("-")
        if (not variant or variant in words) and base in words:
            return GPUS[candidate]
    return None


def detected() -> tuple[Gpu | None, str]:
    """This machine's GPU from nvidia-smi (the first one's name), and what was found."""
    rows = nvidia_smi("name,memory.total")
    if not rows:
        return None, "no nvidia-smi"
    name, memory = rows[0][0], int(float(rows[0][1])) * 2**20 if len(rows[0]) > 1 else 0
    gpu = from_smi_name(name, memory)
    return gpu, f"nvidia-smi: {name}" if gpu else f"nvidia-smi: {name}, not in the GPU table"


def with_interconnect(gpu: Gpu, interconnect: str) -> Gpu:
    """`--interconnect nvlink|pcie|RATE` (RATE in bytes per second each way: `50GB`, `100GiB`)."""
    text = interconnect.strip().lower()
    if text == PCIE:
        return replace(gpu, interconnect=PCIE, interconnect_bandwidth=gpu.host_bandwidth)
    if text == NVLINK:
        if gpu.interconnect == NVLINK:
            return gpu
        raise HardwareError(f"--interconnect nvlink: the {gpu.name} has no NVLink rate in the table; give the "
                            "rate each way per GPU instead (--interconnect 56GB for a 3090's bridge)")
    try:
        rate = parse_size(text.removesuffix("/s"))
    except SizeError:
        raise HardwareError(f"--interconnect {interconnect!r}: write nvlink, pcie, or a rate each way per GPU "
                            "(50GB)") from None
    return replace(gpu, interconnect=f"{gpu.interconnect} ({interconnect})", interconnect_bandwidth=float(rate))


def with_network(gpu: Gpu, network: str) -> Gpu:
    """`--network RATE`: bytes per second each way per GPU between machines (`25GB`: a 200 Gb/s port each)."""
    try:
        rate = parse_size(network.strip().lower().removesuffix("/s"))
    except SizeError:
        raise HardwareError(f"--network {network!r}: write a rate each way per GPU between machines (25GB for "
                            "one 200 Gb/s port per GPU)") from None
    return replace(gpu, network=float(rate), network_source=f"given: --network {network}")


HARDWARE_KEYS = {"name": str, "bf16_tflops": float, "memory_bandwidth_gbs": float, "interconnect": str,
                 "interconnect_gbs": float, "host_gbs": float}


def from_file(path: Path) -> Gpu:
    """A GPU described in a YAML file: `name`, `bf16_tflops`, `memory_bandwidth_gbs`, `interconnect` (nvlink or
    pcie), `interconnect_gbs`, `host_gbs` (GB/s each way per GPU)."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise HardwareError(f"--hardware {path}: cannot be read ({error})") from None
    if not isinstance(data, dict):
        raise HardwareError(f"--hardware {path}: expected a mapping of {', '.join(HARDWARE_KEYS)}")
    missing = [key for key in HARDWARE_KEYS if key not in data]
    unknown = [key for key in data if key not in HARDWARE_KEYS]
    if missing or unknown:
        raise HardwareError(f"--hardware {path}: " + "; ".join(
            filter(None, [f"missing {', '.join(missing)}" if missing else "",
                          f"unknown {', '.join(map(str, unknown))}" if unknown else ""])))
    for key, kind in HARDWARE_KEYS.items():
        value = data[key]
        if kind is float and not (isinstance(value, (int, float)) and not isinstance(value, bool) and
                                  math.isfinite(value) and value > 0):
            raise HardwareError(f"--hardware {path}: `{key}` is {value!r}; give a positive number")
        if kind is str and not (isinstance(value, str) and value.strip()):
            raise HardwareError(f"--hardware {path}: `{key}` is {value!r}; give a name")
    values = {key: kind(data[key]) for key, kind in HARDWARE_KEYS.items()}
    return Gpu(values["name"], values["bf16_tflops"] * TERA, values["memory_bandwidth_gbs"] * GB,
               values["interconnect"], values["interconnect_gbs"] * GB, values["host_gbs"] * GB)
