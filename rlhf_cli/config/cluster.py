"""The job layout a cluster already decided: SLURM's variables, or torchrun-style ones.

Inside an allocation the scheduler knows how many machines there are, which one this is, and who
is first; asking users to repeat it in flags invites a mismatch. Pure: reads a mapping of variables.
Values come as the variables' text: the config layer checks them like any recipe value and names the
variable when one is wrong (SLURM_NNODES=0, NODE_RANK=abc), rather than ignoring it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ClusterLayout:
    values: dict[str, tuple[str, str]] = field(default_factory=dict)  # recipe key -> (the variable's text, variable)
    notes: tuple[str, ...] = ()


def first_host(nodelist: str) -> str:
    """`gpu[03-05,09],cpu1` -> `gpu03`: the first host of a SLURM node list."""
    match = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not match:
        return nodelist
    prefix, ranges = match.groups()
    if not ranges:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0]


def _gpus_per_node(environ: Mapping[str, str]) -> tuple[int, str] | None:
    for name in ("SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE"):
        value = environ.get(name, "").rpartition(":")[2]  # `h100:4` or `4`
        if value.isdigit():
            return int(value), name
    return None


def _slurm(environ: Mapping[str, str]) -> ClusterLayout:
    values: dict[str, tuple[str, str]] = {}
    notes = []
    values["num_machines"] = (environ["SLURM_NNODES"], "SLURM_NNODES")
    machines = int(environ["SLURM_NNODES"]) if environ["SLURM_NNODES"].isdigit() else 0
    if "SLURM_NODEID" in environ:
        values["machine_rank"] = (environ["SLURM_NODEID"], "SLURM_NODEID")
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if nodelist:
        values["main_process_ip"] = (first_host(nodelist), "SLURM_JOB_NODELIST")
    gpus = _gpus_per_node(environ)
    if gpus and machines:
        values["num_processes"] = (str(gpus[0] * machines), f"{gpus[1]} x SLURM_NNODES")
    if machines > 1 and "SLURM_STEP_ID" not in environ:
        notes.append(f"warning: this SLURM job has {machines} nodes but rlhf is not running under srun: start it "
                     "with `srun --ntasks-per-node=1 rlhf ...` so that every node starts its share of the ranks")
    elif environ.get("SLURM_NTASKS_PER_NODE", "1") not in ("1", ""):
        notes.append("warning: SLURM_NTASKS_PER_NODE is not 1: rlhf starts every rank of a node itself, so run "
                     "one rlhf per node (srun --ntasks-per-node=1)")
    return ClusterLayout(values, tuple(notes))


def _torchrun(environ: Mapping[str, str]) -> ClusterLayout:
    """MASTER_ADDR/MASTER_PORT/NODE_RANK and NNODES (or WORLD_SIZE, counted in machines) as set per machine."""
    values: dict[str, tuple[str, str]] = {}
    machines = next(((environ[name], name) for name in ("NNODES", "WORLD_SIZE") if name in environ), None)
    if machines:
        values["num_machines"] = machines
    if "NODE_RANK" in environ:
        values["machine_rank"] = (environ["NODE_RANK"], "NODE_RANK")
    if environ.get("MASTER_ADDR"):
        values["main_process_ip"] = (environ["MASTER_ADDR"], "MASTER_ADDR")
    return ClusterLayout(values)


def detect_layout(environ: Mapping[str, str]) -> ClusterLayout:
    """What the environment says about the job; SLURM first, MASTER_PORT from either."""
    if environ.get("SLURM_JOB_ID") and "SLURM_NNODES" in environ:
        layout = _slurm(environ)
    elif environ.get("MASTER_ADDR"):
        layout = _torchrun(environ)
    else:
        return ClusterLayout()
    if "MASTER_PORT" in environ:
        layout.values["main_process_port"] = (environ["MASTER_PORT"], "MASTER_PORT")
    return layout
