"""This machine's own rates, measured once and remembered, so that the time plan has seconds where no GPU table row
applies (a CPU machine, a GPU the table lacks).

The measurement (`python -m rlhf_cli.machine.calibration`) runs in a subprocess of its own, because it needs torch
and planning never imports it: a matmul's FLOP/s, a large copy's memory bandwidth, and a 2-process all-gather's
rate and latency (gloo on CPU, NCCL on two GPUs), and what a small module's call costs from Python (eager
PyTorch's fixed cost per call, which the time plan counts per generated token, micro-batch and step), about ten
seconds. It is remembered in rlhf's cache dir
(`$RLHF_CACHE`, else ~/.cache/rlhf) as calibration.json; `rlhf doctor --calibrate` measures again.

When it runs: only on `rlhf doctor --calibrate`. Planning never measures (it would cost a fresh machine, a CI
runner, up to a minute of torch imports and spawned processes on every first plan): it reads what is remembered,
and where there is nothing and no GPU it knows, it plans without seconds and says how to get them.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rlhf_cli.machine.cache import cache_dir
from rlhf_cli.machine.gpus import COLLECTIVE_EFFICIENCY, Gpu

FILE_NAME = "calibration.json"
TIMEOUT_SECONDS = 120
# one-element all-gathers timed one a round, the median of the rounds: under a second on a CPU. Single calls, not
# rounds of many: a round as long as a scheduler's slice catches a rank descheduled by other work more often
LATENCY_ROUNDS, LATENCY_CALLS = 301, 1


@dataclass(frozen=True)
class Calibration:
    """What this machine did when measured: rates of the whole machine (its CPU, or one GPU)."""

    device: str  # "cpu" or the GPU's name
    matmul_flops: float  # FLOP/s of a large matmul (fp32 on CPU, bf16 on a GPU)
    memory_bandwidth: float  # bytes/s of a large copy, read and written
    all_gather_rate: float  # bytes/s each of 2 processes receives in a large all-gather
    all_gather_latency: float  # seconds of a one-element all-gather: what ZeRO-3 pays per all-gather it launches
    backend: str  # gloo or nccl
    measured_at: float  # time.time()
    host: str
    call_latency: float | None = None  # seconds of one small module's call from Python (None: measured before it was)

    def age(self, now: float | None = None) -> str:
        seconds = max(0.0, (now or time.time()) - self.measured_at)
        for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
            if seconds >= size:
                count = int(seconds // size)
                return f"{count} {unit}{'s' * (count != 1)} old"
        return f"{int(seconds)} s old"

    def describe(self) -> str:
        return (f"calibrated here ({self.device}, {self.age()}): matmul {self.matmul_flops / 1e9:.3g} GFLOP/s, "
                f"memory {self.memory_bandwidth / 1e9:.3g} GB/s, {self.backend} all-gather "
                f"{self.all_gather_rate / 1e9:.3g} GB/s and {self.all_gather_latency * 1e3:.3g} ms"
                + (f", a module call {self.call_latency * 1e6:.3g} us" if self.call_latency else
                   ", no module call measured (`rlhf doctor --calibrate` again)"))


def as_gpu(calibration: Calibration, processes_per_machine: int) -> Gpu:
    """The calibration as the time plan's GPU: measured rates taken as its peaks (the plan's shares of a peak then
    stand for what transformers' kernels reach of a large matmul), the all-gather as the link between processes;
    on a CPU the processes of a machine share its cores and memory."""
    share = max(1, processes_per_machine) if calibration.device == "cpu" else 1
    return Gpu(f"this machine ({calibration.device}, calibrated)", calibration.matmul_flops / share,
               calibration.memory_bandwidth / share, calibration.backend,
               calibration.all_gather_rate / COLLECTIVE_EFFICIENCY, calibration.memory_bandwidth / share,
               fetch_latency=calibration.all_gather_latency, call_latency=calibration.call_latency)


def remembered(cache: Path | None = None) -> Calibration | None:
    """The calibration kept in the cache dir; None when there is none or it cannot be read."""
    path = (cache or cache_dir()) / FILE_NAME
    try:
        return Calibration(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def calibrate(cache: Path | None = None) -> Calibration:
    """Measure this machine in a subprocess and remember it; raises CalibrationFailed with its last words."""
    try:
        done = subprocess.run([sys.executable, "-m", __name__], capture_output=True, text=True,
                              timeout=TIMEOUT_SECONDS, check=False)
    except subprocess.TimeoutExpired:
        raise CalibrationFailed(f"the measurement took over {TIMEOUT_SECONDS} s") from None
    if done.returncode != 0:
        tail = " | ".join(line.strip() for line in done.stderr.splitlines()[-3:] if line.strip())
        raise CalibrationFailed(f"the measurement failed (exit {done.returncode}): {tail}")
    found = Calibration(**json.loads(done.stdout.strip().splitlines()[-1]))
    path = (cache or cache_dir()) / FILE_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(found), indent=1))
    return found


class CalibrationFailed(RuntimeError):
    """The measurement did not finish; the message says why."""


def _timed(run: Any, repeats: int) -> float:
    run()  # warm-up
    started = time.perf_counter()
    for _ in range(repeats):
        run()
    return (time.perf_counter() - started) / repeats


def _fastest(run: Any, repeats: int, rounds: int = 50) -> float:
    """Seconds of one `run`, from the fastest of `rounds` rounds of `repeats`: the machine's rate, not the share of it
    that other work on the machine left at one moment."""
    return min(_timed(run, repeats) for _ in range(rounds))


def _latency(run: Any, barrier: Any, rounds: int = LATENCY_ROUNDS, calls: int = LATENCY_CALLS) -> float:
    """Seconds of one `run` (a small collective): the median of `rounds` rounds of `calls`, each round started on
    both ranks together (a rank arriving first would time its wait for the other). The median, not the fastest:
    the ranks wait on each other at every fetch, and a shared machine's scheduling is part of what they wait; the
    median of many short rounds keeps one descheduled round from moving it."""
    run()  # warm-up
    times = []
    for _ in range(rounds):
        barrier()
        times.append(_timed(run, calls))
    return statistics.median(times)


def _all_gather(rank: int, port: int, backend: str, found: Any) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    large = torch.ones(8 << 20, device=device)  # 32 MB per rank
    small = torch.ones(1, device=device)
    sync = (lambda: torch.cuda.synchronize(device)) if backend == "nccl" else (lambda: None)

    def gather(tensor: Any) -> None:
        out = [torch.empty_like(tensor) for _ in range(2)]
        dist.all_gather(out, tensor)
        sync()

    into_one = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # torch >= 2.12 renamed it

    def fetch(tensor: Any, out: Any) -> None:  # what ZeRO-3 launches per fetch: into one flat tensor
        into_one(out, tensor)
        sync()

    seconds = _fastest(lambda: gather(large), 1, rounds=5)
    gathered = torch.empty(2, device=device)
    latency = _latency(lambda: fetch(small, gathered), dist.barrier)
    if rank == 0:
        found.put((large.numel() * large.element_size() / seconds, latency))
    dist.destroy_process_group()


def measure() -> Calibration:
    """The measurement itself (needs torch): run only in the subprocess `calibrate` starts."""
    import socket

    import torch
    import torch.multiprocessing as mp

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    size = 8192 if cuda else 1024
    a, b = (torch.randn(size, size, device=device, dtype=dtype) for _ in range(2))
    flops = 2 * size**3 / _fastest(lambda: (a @ b, sync()), 2, rounds=5 if cuda else 3)
    source = torch.empty(256 << 20 if cuda else 64 << 20, device=device, dtype=torch.uint8)
    target = torch.empty_like(source)
    bandwidth = 2 * source.numel() / _fastest(lambda: (target.copy_(source), sync()), 2, rounds=5)
    call = _call_latency(torch, device)
    backend = "nccl" if cuda and torch.cuda.device_count() >= 2 else "gloo"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = mp.get_context("spawn")
    found = context.SimpleQueue()
    mp.start_processes(_all_gather, args=(port, backend, found), nprocs=2, start_method="spawn")
    rate, latency = found.get()
    name = torch.cuda.get_device_name(0) if cuda else "cpu"
    return Calibration(name, flops, bandwidth, rate, latency, backend, time.time(), socket.gethostname(), call)


def _call_latency(torch: Any, device: Any) -> float:
    """Seconds of one call of a tiny nn.Linear from Python: the module machinery, the dispatch and (on a GPU) the
    kernel's launch, without waiting for it; what eager transformers pays per module whatever the model's size.
    The fastest of many short rounds: the call's own cost, not the share of the machine other work leaves a busy
    loop (the ranks, which wait on each other, get more of it than a busy loop does)."""
    layer = torch.nn.Linear(8, 8).to(device)
    tiny = torch.randn(2, 8, device=device)
    with torch.no_grad():
        return _fastest(lambda: layer(tiny), 100)


if __name__ == "__main__":
    print(json.dumps(asdict(measure())))
