"""The plan's data: one candidate configuration, the models of a run, a candidate's column, the whole plan.

`rlhf_cli.plan.estimate` makes them from a resolved run; `Plan.as_dict` is the JSON form documented in
rlhf_cli/plan/__init__.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlhf_cli.generation.budget import Budget
from rlhf_cli.plan import memory
from rlhf_cli.plan.hardware import Hardware
from rlhf_cli.plan.memory import Component
from rlhf_cli.plan.model_sizes import Adapter, ModelSize
from rlhf_cli.plan.vllm import VllmSettings
from rlhf_cli.plan.workload import Workload


@dataclass(frozen=True)
class Candidate:
    gather: bool
    offload_optimizer: str
    offload_params: str
    budget: Budget | None = None  # without gathering: a gather budget of part of the policy
    lora: bool = False  # LoRA on the trained models: frozen base shards, adapters trained, no reference copy
    vllm: VllmSettings | None = None  # vLLM generates; the gather choice sizes its weight sync's bucket

    @property
    def mode(self) -> str:
        return "gather" if self.gather else f"budget {self.budget}" if self.budget else "no-gather"

    @property
    def engine(self) -> str:
        """hf (the policy's generate) or vllm."""
        return "hf" if self.vllm is None else "vllm"

    @property
    def label(self) -> str:
        optimizer, params = self.offload_optimizer, self.offload_params
        if optimizer == params:
            offload = "no offload" if optimizer == "none" else f"opt+params->{optimizer}"
        else:
            offload = ", ".join(f"{what}->{where}" for what, where in (("optimizer", optimizer), ("params", params))
                                if where != "none")
        engine = f"{self.vllm.label}, sync " if self.vllm else ""
        return f"{'LoRA, ' if self.lora else ''}{engine}{self.mode}, {offload}"

    @property
    def offload_short(self) -> str:
        """none, opt (optimizer to CPU), opt+par (optimizer and parameters to CPU), or the devices spelled out."""
        names = {("none", "none"): "none", ("cpu", "none"): "opt", ("cpu", "cpu"): "opt+par"}
        return names.get((self.offload_optimizer, self.offload_params),
                         f"opt:{self.offload_optimizer} par:{self.offload_params}")


@dataclass(frozen=True)
class Role:
    """One model of the run: which, where from, its size, whether it is trained (and its adapter under LoRA)."""

    name: str
    path: str
    size: ModelSize
    trained: bool
    adapter: Adapter | None = None


@dataclass(frozen=True)
class Column:
    candidate: Candidate
    components: list[Component]
    peak: int
    cpu_per_machine: int
    fits: bool
    chosen: bool


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
    vllm_findings: list[str] = field(default_factory=list)  # what colocated vLLM means here, what would fit

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
        lora = self.chosen is not None and self.chosen.candidate.lora
        return sum(memory.checkpoint_bytes(role.adapter.params if lora and role.adapter else role.size.params,
                                           self.work.element_bytes) for role in self.roles if role.trained)

    def column(self, gather: bool, offload_optimizer: str, offload_params: str, lora: bool = False,
               vllm_settings: VllmSettings | None = None) -> Column | None:
        wanted = Candidate(gather, offload_optimizer, offload_params, lora=lora, vllm=vllm_settings)
        return next((column for column in self.columns if column.candidate == wanted), None)

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
                {"label": c.candidate.label, "gather": c.candidate.gather,
                 "gather_budget": str(c.candidate.budget) if c.candidate.budget else None, "lora": c.candidate.lora,
                 "engine": c.candidate.engine, "vllm": c.candidate.vllm.as_dict() if c.candidate.vllm else None,
                 "offload_optimizer": c.candidate.offload_optimizer, "offload_params": c.candidate.offload_params,
                 "components": {part.name: part.gpu for part in c.components},
                 "phases": memory.phase_totals(c.components),
                 "peak_gpu": c.peak, "cpu_per_machine": c.cpu_per_machine, "fits": c.fits, "chosen": c.chosen}
                for c in self.columns],
            "checkpoint_bytes": self.checkpoint_bytes,
            "reason": self.reason, "suggestions": self.suggestions, "notes": self.notes,
            "largest_generation_batch": self.largest_generation_batch,
            "vllm_findings": self.vllm_findings,
        }
