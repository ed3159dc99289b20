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
    # (recipe key it would have set, variable, why its text is not what the scheduler writes there)
    malformed: tuple[tuple[str, str, str], ...] = ()


# One entry of a node list: names and bracketed ranges (`rack[1-2]-gpu[01,03-05]`); entries are joined by commas
# outside the brackets.
_RANGE = r"\d+(?:-\d+)?"
_ENTRY = re.compile(rf"(?:[^\[\],\s]+|\[{_RANGE}(?:,{_RANGE})*\])+")
_BRACKETS = re.compile(r"\[([^\]]*)\]")
_ENTRIES = re.compile(r"(?:[^,\[]|\[[^\]]*\])+")


def first_host(nodelist: str) -> str | None:
    """`gpu[03-05,09],cpu1` -> `gpu03`: the first host of a SLURM node list; None if it is not one (`gpu[01-`)."""
    text = nodelist.strip()
    entries = _ENTRIES.findall(text)
    if not text or ",".join(entries) != text or not all(_ENTRY.fullmatch(entry) for entry in entries):
        return None
    for start, _, end in (part.partition("-") for group in _BRACKETS.findall(text) for part in group.split(",")):
        if end and int(end) < int(start):
            return None
    return _BRACKETS.sub(lambda group: group.group(1).split(",")[0].split("-")[0], entries[0])


def _gpus_per_node(environ: Mapping[str, str]) -> tuple[str, str] | None:
    """(count, variable) of the first of SLURM's GPU variables set; the count is checked as a number later."""
    for name in ("SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE"):
        if environ.get(name, "").strip():
            return environ[name].rpartition(":")[2].strip(), name  # `h100:4` or `4`
    return None


def _slurm(environ: Mapping[str, str]) -> ClusterLayout:
    values: dict[str, tuple[str, str]] = {}
    notes = []
    values["num_machines"] = (environ["SLURM_NNODES"], "SLURM_NNODES")
    machines = int(environ["SLURM_NNODES"]) if environ["SLURM_NNODES"].isdigit() else 0
    if "SLURM_NODEID" in environ:
        values["machine_rank"] = (environ["SLURM_NODEID"], "SLURM_NODEID")
    malformed = []
    variable = next((name for name in ("SLURM_JOB_NODELIST", "SLURM_NODELIST") if environ.get(name)), None)
    if variable is not None:
        host = first_host(environ[variable])
        if host is None:
            malformed.append(("main_process_ip", variable, "not a SLURM node list (names and bracketed ranges like "
                                                           "gpu[01-04,07])"))
        else:
            values["main_process_ip"] = (host, variable)
    gpus = _gpus_per_node(environ)
    if gpus and not gpus[0].isdigit():
        malformed.append(("num_processes", gpus[1], "not a GPU count (4, or h100:4)"))
    elif gpus and machines:
        values["num_processes"] = (str(int(gpus[0]) * machines), f"{gpus[1]} x SLURM_NNODES")
    if machines > 1 and "SLURM_STEP_ID" not in environ:
        notes.append(f"warning: this SLURM job has {machines} nodes but rlhf is not running under srun: start it "
                     "with `srun --ntasks-per-node=1 rlhf ...` so that every node starts its share of the ranks")
    elif environ.get("SLURM_NTASKS_PER_NODE", "1") not in ("1", ""):
        notes.append("warning: SLURM_NTASKS_PER_NODE is not 1: rlhf starts every rank of a node itself, so run "
                     "one rlhf per node (srun --ntasks-per-node=1)")
    return ClusterLayout(values, tuple(notes), tuple(malformed))


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
