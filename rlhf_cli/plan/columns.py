"""The plan's data: one candidate configuration, the models of a run, a candidate's column, the whole plan.

`rlhf_cli.plan.estimate` makes them from a resolved run; `Plan.as_dict` is the JSON form documented in
rlhf_cli/plan/__init__.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from rlhf_cli.generation.choice import Engine, Generation
from rlhf_cli.plan import memory
from rlhf_cli.plan.engines import FINDINGS_KEY, SETTINGS_KEY
from rlhf_cli.plan.hardware import Hardware
from rlhf_cli.plan.memory import Component
from rlhf_cli.plan.model_sizes import Adapter, ModelSize
from rlhf_cli.plan.workload import Workload

OFFLOADS = (("none", "none"), ("cpu", "none"), ("cpu", "cpu"))  # (optimizer, parameters), cheapest first


class EngineSettings(Protocol):
    """A separate engine's settings in a candidate (a type of its plan room, rlhf_cli/plan/engines/): how they read
    in a table's title, a column's label and the plan's JSON."""

    def description(self, engine: Engine) -> str: ...

    def label(self, engine: Engine) -> str: ...

    def as_dict(self, engine: Engine) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Candidate:
    """One configuration the plan counts: how the run generates and syncs, where ZeRO-3 offloads, LoRA or not."""

    generation: Generation  # the engine, and how much of the policy is gathered at once (to generate or to sync)
    offload_optimizer: str
    offload_params: str
    lora: bool = False  # LoRA on the trained models: frozen base shards, adapters trained, no reference copy
    # the separate engine's settings (its plan room's type); set exactly when `generation.engine` is separate
    engine_settings: EngineSettings | None = None

    @property
    def colocated(self) -> Any:
        """The engine's settings when it runs inside every training process (its memory is on the training GPUs);
        None otherwise."""
        return self.engine_settings if self.generation.engine.spec.is_colocated else None

    @property
    def mode(self) -> str:
        """The gather choice as a column's header: gather, budget 0.5, no-gather."""
        gather = self.generation.gather
        return {"whole": "gather", "shards": "no-gather"}.get(gather.mode, str(gather))

    @property
    def engine(self) -> str:
        """The engine's name in the registry: hf (the policy's generate) or a separate engine's."""
        return self.generation.engine.name

    @property
    def label(self) -> str:
        optimizer, params = self.offload_optimizer, self.offload_params
        if optimizer == params:
            offload = "no offload" if optimizer == "none" else f"opt+params->{optimizer}"
        else:
            offload = ", ".join(f"{what}->{where}" for what, where in (("optimizer", optimizer), ("params", params))
                                if where != "none")
        engine = f"{self.engine_settings.label(self.generation.engine)}, sync " if self.engine_settings else ""
        return f"{'LoRA, ' if self.lora else ''}{engine}{self.mode}, {offload}"

    @property
    def offload_short(self) -> str:
        """none, opt (optimizer to CPU), opt+par (optimizer and parameters to CPU), or the devices spelled out."""
        names = {("none", "none"): "none", ("cpu", "none"): "opt", ("cpu", "cpu"): "opt+par"}
        return names.get((self.offload_optimizer, self.offload_params),
                         f"opt:{self.offload_optimizer} par:{self.offload_params}")


@dataclass(frozen=True)
class Role:
    """One model of the run: which, where from, its size, whether it is trained (and its adapter under LoRA), and
    whether its ZeRO-3 shards live in host memory whatever the run offloads (a frozen model under a DeepSpeed config
    of its own, as ms-swift's `--teacher_deepspeed zero3_offload` gives a distillation teacher)."""

    name: str
    path: str
    size: ModelSize
    trained: bool
    adapter: Adapter | None = None
    offloaded: bool = False


def trained_checkpoint_bytes(roles: list[Role], lora: bool, element_bytes: int) -> int:
    """Bytes of one checkpoint of every trained model (with LoRA, of its adapters)."""
    return sum(memory.checkpoint_bytes(role.adapter.params if lora and role.adapter else role.size.params,
                                       element_bytes) for role in roles if role.trained)


@dataclass(frozen=True)
class Column:
    candidate: Candidate
    components: list[Component]
    peak: int
    cpu_per_machine: int
    fits: bool
    chosen: bool
    seconds: dict[str, float] | None = None  # per optimizer step by phase (rlhf_cli/plan/time.py); None: no GPU known

    @property
    def step_seconds(self) -> float | None:
        return sum(self.seconds.values()) if self.seconds is not None else None


@dataclass(frozen=True)
class Plan:
    """The plan of one run; `known` False means it could not be made, `why_unknown` says why."""

    known: bool
    why_unknown: str = ""
    hardware: Hardware | None = None
    roles: list[Role] = field(default_factory=list)
    work: Workload | None = None
    columns: list[Column] = field(default_factory=list)
    reason: str = ""
    suggestions: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    largest_generation_batch: int | None = None  # per GPU, with the run's own configuration; None: not even 1
    engine_findings: list[str] = field(default_factory=list)  # what the separate engine means here, what would fit

    @property
    def chosen(self) -> Column | None:
        return next((column for column in self.columns if column.chosen), None)

    @property
    def checkpoint_bytes(self) -> int | None:
        """Bytes of one checkpoint on disk (every trained model's weights and optimizer states, or with LoRA its
        adapters'); None: unknown."""
        if not self.known:
            return None
        assert self.work is not None
        return trained_checkpoint_bytes(self.roles, self.chosen is not None and self.chosen.candidate.lora,
                                        self.work.element_bytes)

    def column(self, generation: Generation, offload_optimizer: str, offload_params: str, lora: bool = False,
               engine_settings: EngineSettings | None = None) -> Column | None:
        wanted = Candidate(generation, offload_optimizer, offload_params, lora=lora, engine_settings=engine_settings)
        return next((column for column in self.columns if column.candidate == wanted), None)

    @property
    def fastest(self) -> Column | None:
        """The fitting configuration with the fewest seconds per optimizer step; None: none fits or no GPU known."""
        timed = [column for column in self.columns if column.fits and column.step_seconds is not None]
        return min(timed, key=lambda column: column.step_seconds or 0.0, default=None)

    @property
    def smallest(self) -> Column | None:
        """The fitting configuration with the least peak per GPU."""
        return min((column for column in self.columns if column.fits), key=lambda column: column.peak, default=None)

    def as_dict(self) -> dict[str, Any]:
        """The JSON form; keys documented in rlhf_cli/plan/__init__.py."""
        if not self.known:
            return {"known": False, "why_unknown": self.why_unknown}
        assert self.hardware is not None and self.work is not None
        return {
            "known": True,
            "gpu_memory": self.hardware.gpu_memory, "gpus_per_machine": self.hardware.gpus_per_machine,
            "machines": self.hardware.machines, "hardware_source": self.hardware.source, "margin": memory.MARGIN,
            "models": {role.name: {"name_or_path": role.path, "params": role.size.params,
                                   "largest_layer": role.size.largest_layer, "trained": role.trained,
                                   "adapter_params": role.adapter.params if role.adapter else None}
                       for role in self.roles},
            "workload": self.work.as_dict(),
            "configurations": [
                {"label": c.candidate.label, "gather": c.candidate.generation.gather.mode == "whole",
                 "gather_budget": str(c.candidate.generation.gather.budget) if c.candidate.generation.gather.budget
                 else None, "generation": c.candidate.generation.describe(), "lora": c.candidate.lora,
                 "engine": c.candidate.engine,
                 SETTINGS_KEY: c.candidate.engine_settings.as_dict(c.candidate.generation.engine)
                 if c.candidate.engine_settings else None,
                 "offload_optimizer": c.candidate.offload_optimizer, "offload_params": c.candidate.offload_params,
                 "components": {part.name: part.gpu for part in c.components},
                 "phases": memory.phase_totals(c.components),
                 "peak_gpu": c.peak, "cpu_per_machine": c.cpu_per_machine, "fits": c.fits, "chosen": c.chosen,
                 "time": {phase: round(seconds, 6) for phase, seconds in c.seconds.items()} if c.seconds else None,
                 "step_seconds": c.step_seconds}
                for c in self.columns],
            "gpu": self.hardware.gpu.as_dict() | {"source": self.hardware.gpu_source,
                                                  "corrections": dict(self.hardware.corrections)}
            if self.hardware.gpu else None,
            "fastest": self.fastest.candidate.label if self.fastest else None,
            "smallest": self.smallest.candidate.label if self.smallest else None,
            "checkpoint_bytes": self.checkpoint_bytes,
            "reason": self.reason, "suggestions": self.suggestions, "notes": self.notes,
            "largest_generation_batch": self.largest_generation_batch,
            FINDINGS_KEY: self.engine_findings,
        }
