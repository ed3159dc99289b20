"""Is this machine ready for rlhf? Each check returns what it found as data; the CLI prints it.

A `problem` stops runs (a missing package, a version outside the tested range, no compiler to build
DeepSpeed's ops); a `warning` limits them (no GPU, no hub); `ok` is fine.
"""

from __future__ import annotations

import contextlib
import io
import os
import platform
import shutil
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Callable

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from rlhf_cli.machine.probe import nvidia_smi
from rlhf_cli.models.hub import hub_cache

OK, WARNING, PROBLEM = "ok", "warning", "problem"
HUB_TIMEOUT_S = 3
DEFAULT_ENDPOINT = "https://huggingface.co"
TRUE_VALUES = ("1", "true", "yes", "on")
FIRST_PACKAGES = ("torch", "transformers", "trl", "deepspeed", "accelerate", "datasets", "typer")


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok | warning | problem
    detail: str


def _installed_version(name: str) -> str:
    return metadata.version(name)


def _requirements() -> list[Requirement] | None:
    """What rlhf's installed metadata pins (pyproject's dependencies), without extras; None when not installed."""
    try:
        specs = metadata.requires("rlhf") or []
    except metadata.PackageNotFoundError:
        return None
    requirements = [Requirement(spec) for spec in specs]
    requirements = [r for r in requirements if r.marker is None or r.marker.evaluate()]
    order = {name: index for index, name in enumerate(FIRST_PACKAGES)}
    return sorted(requirements, key=lambda r: (order.get(r.name, len(order)), r.name))


def _range(specifier: SpecifierSet) -> str:
    """`>=2.9,<2.15`: lower bounds first, as people write them."""
    return ",".join(sorted(map(str, specifier), key=lambda spec: (not spec.startswith(">"), spec))) or "any version"


def check_python() -> list[Check]:
    version = platform.python_version()
    try:
        needed = metadata.metadata("rlhf")["Requires-Python"] or ""
    except metadata.PackageNotFoundError:
        needed = ""
    if needed and not SpecifierSet(needed).contains(version, prereleases=True):
        return [Check("python", PROBLEM, f"{version}; rlhf needs {needed}")]
    return [Check("python", OK, f"{version}" + (f" (rlhf needs {needed})" if needed else ""))]


def check_packages() -> list[Check]:
    requirements = _requirements()
    if requirements is None:
        return [Check("rlhf", WARNING, "not installed (pip install -e .): the tested version ranges are unknown")]
    checks = []
    for requirement in requirements:
        name, wanted = requirement.name, _range(requirement.specifier)
        try:
            version = _installed_version(name)
        except metadata.PackageNotFoundError:
            checks.append(Check(name, PROBLEM, f"not installed; pip install '{name}{wanted}'"))
            continue
        try:
            inside = requirement.specifier.contains(Version(version), prereleases=True)
        except InvalidVersion:
            checks.append(Check(name, WARNING, f"{version}: not a version number; rlhf is tested with {wanted}"))
            continue
        if inside:
            checks.append(Check(name, OK, f"{version} (tested: {wanted})"))
        else:
            checks.append(Check(name, PROBLEM, f"{version} is outside the tested range {wanted}; "
                                               f"pip install '{name}{wanted}'"))
    return checks


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_gib: float


@cache
def gpus() -> tuple[Gpu, ...]:
    """The GPUs nvidia-smi lists, else those torch sees (ROCm included)."""
    if shutil.which("nvidia-smi"):
        return tuple(Gpu(", ".join(row[:-1]), float(row[-1]) / 1024)
                     for row in nvidia_smi("name,memory.total") if len(row) > 1 and row[-1].isdigit())
    try:
        import torch
    except ImportError:
        return ()
    if not torch.cuda.is_available():
        return ()
    properties = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
    return tuple(Gpu(p.name, p.total_memory / 2**30) for p in properties)


def check_gpus() -> list[Check]:
    found = gpus()
    if not found:
        unseen = " (nvidia-smi lists none: is the driver loaded?)" if shutil.which("nvidia-smi") else ""
        return [Check("GPUs", WARNING, f"CPU only: runs use DeepSpeed's CPU path{unseen}")]
    kinds = sorted({f"{gpu.name} ({gpu.memory_gib:.0f} GiB)" for gpu in found})
    return [Check("GPUs", OK, f"{len(found)}: {', '.join(kinds)}")]


def _cuda_toolkit() -> str | None:
    """Where torch's extension builder would find the CUDA compiler, as it looks for it."""
    for variable in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(variable)
        if home and Path(home, "bin", "nvcc").exists():
            return f"{variable}={home}"
    nvcc = shutil.which("nvcc")
    if nvcc:
        return nvcc
    return "/usr/local/cuda" if Path("/usr/local/cuda/bin/nvcc").exists() else None


def check_build_tools() -> list[Check]:
    """DeepSpeed compiles its ops (CPU Adam, fused Adam, ...) on first use: a C++ compiler and ninja are needed."""
    compiler = next(filter(None, (shutil.which(name) for name in
                                  (os.environ.get("CXX", ""), "c++", "g++", "clang++") if name)), None)
    checks = [Check("C++ compiler", OK, compiler) if compiler else
              Check("C++ compiler", PROBLEM, "none on PATH (c++, g++, clang++): DeepSpeed cannot build its ops; "
                                             "install g++ or set CXX")]
    ninja = shutil.which("ninja")
    checks.append(Check("ninja", OK, ninja) if ninja else
                  Check("ninja", PROBLEM, "not on PATH: DeepSpeed builds its ops with it; pip install ninja"))
    if gpus():
        toolkit = _cuda_toolkit()
        checks.append(Check("CUDA compiler", OK, toolkit) if toolkit else
                      Check("CUDA compiler", WARNING, "no nvcc on PATH and no CUDA_HOME: DeepSpeed's CUDA ops "
                                                      "(fused Adam, ...) cannot be built; install the CUDA toolkit"))
    return checks


def _deepspeed_accelerator() -> str:
    # DeepSpeed announces its choice on stdout while importing; keep stdout for our own (JSON) output.
    with contextlib.redirect_stdout(io.StringIO()):
        from deepspeed.accelerator import get_accelerator

        return get_accelerator().device_name()


def check_accelerator() -> list[Check]:
    chosen = os.environ.get("DS_ACCELERATOR")
    if chosen:
        return [Check("DeepSpeed accelerator", OK, f"{chosen} (DS_ACCELERATOR)")]
    try:
        name = _deepspeed_accelerator()
    except Exception as error:  # any failure to import DeepSpeed is what this check reports
        return [Check("DeepSpeed accelerator", PROBLEM, f"DeepSpeed does not load: {error}".splitlines()[0])]
    if gpus() and name == "cpu":
        return [Check("DeepSpeed accelerator", PROBLEM, "cpu, although there are GPUs: is torch built without "
                                                        "CUDA? (python -c 'import torch; print(torch.version.cuda)')")]
    note = "; rlhf sets DS_ACCELERATOR=cpu itself where there is no CUDA" if name == "cpu" else ""
    return [Check("DeepSpeed accelerator", OK, f"{name}{note}")]


def check_hub() -> list[Check]:
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in TRUE_VALUES:
        return [Check("hub", OK, "skipped: HF_HUB_OFFLINE is set")]
    endpoint = os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT
    started = time.monotonic()
    try:
        with urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=HUB_TIMEOUT_S) as reply:
            status = reply.status
    except urllib.error.HTTPError as error:  # an answer, even an error page, means the hub is reachable
        status = error.code
    except (OSError, ValueError) as error:
        reason = getattr(error, "reason", error)
        return [Check("hub", WARNING, f"{endpoint} not reachable ({reason}): only local models and data will load")]
    return [Check("hub", OK, f"{endpoint} reachable (HTTP {status}, {time.monotonic() - started:.1f} s)")]


def _size(path: Path) -> int:
    """Bytes in the files under `path`; links (the hub's snapshots point at its blobs) are not counted."""
    total = 0
    for root, _, files in os.walk(path):
        total += sum(os.stat(file).st_size for file in (os.path.join(root, name) for name in files)
                     if not os.path.islink(file))
    return total


def _human(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def check_hub_cache() -> list[Check]:
    path = hub_cache()
    existing = next(parent for parent in (path, *path.parents) if parent.exists())
    if not existing.is_dir():  # HF_HOME (or HF_HUB_CACHE) a file: every download and load fails
        return [Check("hub cache", PROBLEM, f"{path} cannot be created: {existing} is not a directory; point "
                      "HF_HOME (or HF_HUB_CACHE) at a directory")]
    free = f"{_human(shutil.disk_usage(existing).free)} free"
    if not path.exists():
        return [Check("hub cache", OK, f"{path} (not created yet; {free})")]
    if not os.access(path, os.W_OK):
        return [Check("hub cache", WARNING, f"{path} is not writable: downloads will fail; set HF_HOME")]
    return [Check("hub cache", OK, f"{path} ({_human(_size(path))}; {free})")]


CHECKS: tuple[Callable[[], list[Check]], ...] = (
    check_python, check_packages, check_gpus, check_build_tools, check_accelerator, check_hub, check_hub_cache,
)


def run_checks() -> list[Check]:
    return [check for function in CHECKS for check in function()]
