"""What generation costs each rank, when a test or benchmark asks (RLHF_PROBE_GENERATION, RLHF_PROBE_CUDA_MEMORY):
gathered parameters, all-gathers, memory and time per generation call, and peak CUDA memory per phase. Measured
around TRL's generation context, which rlhf_cli/rank/zero3.py wraps; written into `ranks/rank-N.json`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

from rlhf_cli import compat
from rlhf_cli.output.run_dir import PROBE_CUDA_MEMORY_ENV, PROBE_GENERATION_ENV
from rlhf_cli.phases import StepPhase
from rlhf_cli.rank.phases import PeakMeter

CUDA_PEAKS = ("max_allocated_bytes", "max_reserved_bytes", "outside_allocator_bytes")


class GenerationProbe:
    """What one generation call cost this rank, measured around TRL's generation context.

    - gathered parameters: at every submodule's forward, how many ZeRO-3 parameters are fully present
      (`ds_status == AVAILABLE`). With --gather the whole model is present (1.0); without it, only the
      layers being run and those prefetched. Their bytes count those still being gathered too.
    - all-gathers: every all-gather collective DeepSpeed's communication backend launches (with --gather
      one per partitioned tensor, all at entry; without it one per fetched group of tensors, every token).
    - the units a gather budget gathered once for the call, and their bytes.
    - a digest of each batch of sequences generated: runs that generate the same tokens record the same digests.
    - process memory: the largest resident set size above the one at entry, sampled by a thread.
    - wall time of the call, gathering and releasing included.
    """

    calls: list[dict[str, Any]] = []
    ALL_GATHER_METHODS = ("all_gather", "all_gather_into_tensor", "all_gather_base", "all_gather_coalesced")
    RSS_INTERVAL_S = 0.01

    def __init__(self, model: Any) -> None:
        self.available, self.partitioned = compat.zero3_param_states()
        self.params = [p for p in model.parameters() if hasattr(p, "ds_status")]
        self.total = sum(p.ds_numel for p in self.params)
        self.total_bytes = sum(p.ds_numel * p.element_size() for p in self.params)
        self.peak = 0
        self.peak_bytes = 0
        self.all_gathers = 0
        self.units: list[str] = []  # gathered once by the gather budget
        self.units_bytes = 0
        self.completions: list[str] = []  # a digest of each batch of sequences generated (prompts included)
        self._collective_depth = 0  # a backend method calling another is one launch

    def sample(self, *_: Any) -> None:
        self.peak = max(self.peak, sum(p.ds_numel for p in self.params if p.ds_status == self.available))
        # Memory: a parameter being gathered (prefetched) already holds its full buffer.
        held = sum(p.ds_numel * p.element_size() for p in self.params if p.ds_status != self.partitioned)
        self.peak_bytes = max(self.peak_bytes, held)

    @contextlib.contextmanager
    def sampling(self, module: Any, model: Any, gathered: Sequence[Any]) -> Iterator[None]:
        """Sample the gathered parameters at every forward of `module`'s submodules; note the units the gather
        budget gathered once (zero3's ModuleUnit), and a digest of every batch of sequences `model` generates."""
        self.units = [unit.unit.name for unit in gathered]
        self.units_bytes = sum(p.ds_numel * p.element_size() for unit in gathered for p in unit.params)
        self.sample()
        handles = []
        for submodule in module.modules():
            handles.append(submodule.register_forward_pre_hook(self.sample))
            handles.append(submodule.register_forward_hook(self.sample))
        generate = model.generate

        def recorded(*args: Any, **kwargs: Any) -> Any:
            out = generate(*args, **kwargs)
            sequences = getattr(out, "sequences", out)
            self.completions.append(hashlib.sha256(sequences.cpu().numpy().tobytes()).hexdigest()[:16])
            return out

        model.generate = recorded  # an instance attribute, shadowing the class's method until deleted
        try:
            yield
        finally:
            del model.generate
            for handle in handles:
                handle.remove()

    @contextlib.contextmanager
    def counting_all_gathers(self) -> Iterator[None]:
        backend = compat.deepspeed_comm_backend()
        names = [name for name in self.ALL_GATHER_METHODS if backend is not None and hasattr(backend, name)]
        for name in names:
            setattr(backend, name, self._counted(getattr(backend, name)))
        try:
            yield
        finally:
            for name in names:
                delattr(backend, name)  # the instance attribute shadowed the class's method

    def _counted(self, method: Any) -> Any:
        def launch(*args: Any, **kwargs: Any) -> Any:
            if self._collective_depth == 0:
                self.all_gathers += 1
            self._collective_depth += 1
            try:
                return method(*args, **kwargs)
            finally:
                self._collective_depth -= 1
        return launch

    @contextlib.contextmanager
    def watching_memory(self) -> Iterator[dict[str, int]]:
        """Yield a dict filled when the block ends: resident memory at entry, at its peak, and the rise.

        The rise alone understates later calls: the allocator keeps what an earlier call freed, so it is
        already counted at entry; the absolute peak compares across runs of the same model.
        """
        import threading

        import psutil

        process = psutil.Process()
        start = process.memory_info().rss
        peak = [start]
        done = threading.Event()

        def watch() -> None:
            while not done.wait(self.RSS_INTERVAL_S):
                peak[0] = max(peak[0], process.memory_info().rss)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        result: dict[str, int] = {}
        try:
            yield result
        finally:
            done.set()
            watcher.join()
            top = max(peak[0], process.memory_info().rss)
            result.update(rss_start_bytes=start, rss_peak_bytes=top, rss_peak_delta_bytes=top - start)


@contextlib.contextmanager
def probe_generation(model: Any, gather: bool) -> Iterator[Any]:
    """Measure one generation call when RLHF_PROBE_GENERATION is set; else a probe that measures nothing."""
    if not os.environ.get(PROBE_GENERATION_ENV):
        yield _NoProbe()
        return
    probe = GenerationProbe(model)
    started = time.perf_counter()
    with probe.watching_memory() as memory, probe.counting_all_gathers():
        yield probe
    if probe.total:
        GenerationProbe.calls.append({
            "gather": gather, "full_numel": probe.total, "peak_numel": probe.peak,
            "peak_fraction": probe.peak / probe.total, "peak_bytes": probe.peak_bytes, "full_bytes": probe.total_bytes,
            "all_gathers": probe.all_gathers, "seconds": time.perf_counter() - started,
            "budget_units": probe.units, "budget_bytes": probe.units_bytes, "completions": probe.completions,
            **memory})


class _NoProbe:
    @contextlib.contextmanager
    def sampling(self, module: Any, model: Any, gathered: Sequence[Any]) -> Iterator[None]:
        yield


class PhaseMemory:
    """Peak CUDA memory of each phase of a rank's run, when RLHF_PROBE_CUDA_MEMORY is set.

    Phases: `load` until the first generation, `generation` inside TRL's generation context (gathering
    included), `train` between generations (scoring, reference and policy passes, backward, optimizer step).
    Peaks are torch's allocator peaks, reset at each phase change; `outside_allocator_bytes` is what the
    device has in use beyond what the allocator reserved (CUDA context, NCCL and library workspaces). Each
    generation call's start and seconds are kept too, so that a benchmark reads seconds per step from the
    spacing of the calls. Without CUDA only the calls' times are kept.
    """

    active: PhaseMemory | None = None

    def __init__(self, cuda: Any | None, clock: Any = time.perf_counter, meter: PeakMeter | None = None) -> None:
        self.cuda = cuda  # `torch.cuda`, or None
        # The rank's shared meter (rlhf_cli/rank/phases.py): the step phases restart the same peaks.
        self.meter = meter or (PeakMeter.of_cuda(cuda) if cuda is not None else None)
        self.clock = clock
        self.started = clock()
        self.phase = "load"
        self.peaks: dict[str, dict[str, int]] = {}
        self.generation_calls: list[dict[str, float]] = []

    @classmethod
    def current(cls) -> PhaseMemory | None:
        """This rank's recorder when the probe is asked for (made at the first generation), else None."""
        if cls.active is None and os.environ.get(PROBE_CUDA_MEMORY_ENV):
            import torch

            cuda = torch.cuda if torch.cuda.is_available() else None
            cls.active = cls(cuda, meter=PeakMeter.current() if cuda is not None else None)
        return cls.active

    def _switch(self, phase: str) -> dict[str, int]:
        """End the current phase (folding its peaks into its record) and start `phase` with fresh peaks."""
        ended: dict[str, int] = {}
        if self.meter is not None:
            taken = self.meter.take("probe")
            ended = {key: taken[key] for key in CUDA_PEAKS}
            record = self.peaks.setdefault(self.phase, dict.fromkeys(ended, 0))
            for key, value in ended.items():
                record[key] = max(record[key], value)
        self.phase = phase
        return ended

    @contextlib.contextmanager
    def generating(self) -> Iterator[None]:
        self._switch(StepPhase.GENERATION)
        started = self.clock()
        try:
            yield
        finally:
            peaks = self._switch(StepPhase.TRAIN)
            self.generation_calls.append({"started_s": started - self.started, "seconds": self.clock() - started,
                                          **peaks})

    def record(self) -> dict[str, Any]:
        """What the rank writes into `ranks/rank-N.json`; ends the open phase."""
        self._switch(self.phase)
        return {"cuda": self.cuda is not None, "phases": self.peaks, "generation_calls": self.generation_calls}
