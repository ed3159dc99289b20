"""The engine registry (rlhf_cli/generation/engines.py): every row complete, every field checked against what it
names (TRL's schema, pyproject's extras, the engine's own sampling parameters, the CLI, the modules of each layer).

As tests/test_algorithms.py does for algorithms: a field added to `EngineSpec` without a check here fails
`test_every_field_has_a_check`.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
from collections.abc import Callable
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.version import Version
from typer.testing import CliRunner

from helpers import REPO
from rlhf_cli.algorithms import ALGORITHMS
from rlhf_cli.algorithms.spec import load_object
from rlhf_cli.cli.app import app
from rlhf_cli.config.fields import catalogue
from rlhf_cli.generation.choice import Engine
from rlhf_cli.generation.engines import ENGINES, LAYERS, OBJECT_FACES, SETTINGS_FACES, EngineSpec, installed
from rlhf_cli.rank.ppo.rollouts import Rollouts

ROWS = list(ENGINES.values())
IDS = [spec.label for spec in ROWS]
EXTRAS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
# Where each engine's own code defines the sampling keys it takes (read as text: importing vLLM takes seconds).
SAMPLING_SOURCES = {"hf": ("transformers", "generation/configuration_utils.py"),
                    "vllm": ("vllm", "sampling_params.py")}


def _source(package: str, relative: str) -> str | None:
    found = importlib.util.find_spec(package)
    if found is None or not found.submodule_search_locations:
        return None
    return (Path(next(iter(found.submodule_search_locations))) / relative).read_text()


def _takes_key(spec: EngineSpec) -> bool:
    text = _source(*SAMPLING_SOURCES[spec.name])
    if text is None:
        pytest.skip(f"{spec.name} is not installed here: its sampling keys cannot be read")
    return f"{spec.forced_length_key}:" in text or f"self.{spec.forced_length_key} =" in text


def _pinned_inside(distribution: str, versions: tuple[str, str]) -> bool:
    """pyproject's extra pins `distribution` from a release inside the range the row checks."""
    pinned = next(Requirement(line) for lines in EXTRAS.values() for line in lines
                  if Requirement(line).name == distribution)
    lowest = next(Version(bound.version) for bound in pinned.specifier if bound.operator == ">=")
    return Version(versions[0]) <= lowest <= Version(versions[1])


def _is_command(line: str) -> bool:
    """`rlhf WORDS...` is one of the CLI's commands (its help answers)."""
    program, *words = line.split()
    return program == "rlhf" and CliRunner().invoke(app, [*words, "--help"]).exit_code == 0


# What each layer asks of a separate engine's module (the layers' engines/__init__.py say what each is for)
LAYER_OFFERS = {
    "config": ("engine_problems", "length_problems", "tied_head_problems", "check_server", "SYNC_DEFAULT_SOURCE"),
    "plan": ("engine_rows", "engine_starts", "engine_batch", "engine_seconds", "run_settings", "left_open",
             "engine_findings", "WORDS"),
    "rank": ("install", "refuse_resized_policy"),
}


def _layer_faces(spec: EngineSpec) -> bool:
    """An installable engine has code in config, plan and rank, each module offering what its layer asks; every
    layer module it names exists."""
    layers = {face: path for face, path in spec.faces.items() if face not in OBJECT_FACES + SETTINGS_FACES}
    return set(layers) <= set(LAYERS) and (not spec.distributions or {"config", "plan", "rank"} <= set(layers)) \
        and all(importlib.util.find_spec(path) is not None for path in layers.values()) \
        and all(hasattr(importlib.import_module(path), name) for face, path in layers.items()
                for name in LAYER_OFFERS.get(face, ()))


def _object_faces(spec: EngineSpec) -> bool:
    """Every engine implements every object face (PPO's rollouts), as a class with that face's methods."""
    if not set(OBJECT_FACES) <= set(spec.faces):
        return False
    rollouts = load_object(spec.faces["ppo_rollouts"])
    return all(callable(getattr(rollouts, method, None))
               for method in ("of_trainer", *(name for name in vars(Rollouts) if not name.startswith("_"))))


def _settings_faces(spec: EngineSpec) -> bool:
    """The settings an engine adds to a config of rlhf's own are dataclass fields every default of which builds."""
    return all(dataclasses.is_dataclass(settings := load_object(spec.faces[face])) and settings() is not None
               for face in SETTINGS_FACES if face in spec.faces)


FIELD_CHECKS: dict[str, Callable[[EngineSpec], bool]] = {
    "name": lambda s: Engine(s.name, s.mode).spec is s and s.name == s.name.lower(),
    # the mode TRL's keys say is the row's own, read back the way every layer reads a run's engine
    "mode": lambda s: Engine.from_values(dict(s.trl_keys).get) == Engine(s.name, s.mode),
    "label": lambda s: str(Engine(s.name, s.mode)) == s.label and [r.label for r in ROWS].count(s.label) == 1,
    # every key it sets is a field of every algorithm that can generate with it, and its values are allowed
    "trl_keys": lambda s: all(key in catalogue(entry.name) for entry in ALGORITHMS.values()
                              if "use_vllm" in catalogue(entry.name) for key in s.trl_keys),
    # each distribution is one of pyproject's extras, pinned inside the range the row checks
    "distributions": lambda s: all(_pinned_inside(name, s.versions) for name in s.distributions),
    "versions": lambda s: (s.versions is None) == (not s.distributions)
    and (s.versions is None or Version(s.versions[0]) <= Version(s.versions[1])),
    "install": lambda s: (not s.distributions and not s.install)
    or all(f".[{extra}]" in s.install for extra in EXTRAS if any(
        Requirement(line).name in s.distributions for line in EXTRAS[extra])),
    "forced_length_key": _takes_key,
    # whole numbers of GiB (what the pre-launch checks hold a run's own value to), named for the engine
    "cpu_environment": lambda s: all(name.startswith(f"{s.name.upper()}_") and value.isdigit()
                                     for name, value in s.cpu_environment.items()),
    "serve_command": lambda s: (s.serve_command is None) == (not s.is_server)
    and (s.serve_command is None or _is_command(s.serve_command)),
    "faces": lambda s: _layer_faces(s) and _object_faces(s) and _settings_faces(s),
}


def test_every_field_has_a_check() -> None:
    assert set(FIELD_CHECKS) == {field.name for field in dataclasses.fields(EngineSpec)}


@pytest.mark.parametrize("field", sorted(FIELD_CHECKS))
@pytest.mark.parametrize("spec", ROWS, ids=IDS)
def test_row_field(spec: EngineSpec, field: str) -> None:
    assert FIELD_CHECKS[field](spec), f"{spec.label}: engine registry field `{field}` is missing or wrong"


def test_every_engine_value_has_a_row() -> None:
    assert {Engine.hf.spec, Engine.colocate.spec, Engine.server.spec} == set(ROWS)


def test_a_missing_field_fails_its_check() -> None:
    bare = EngineSpec("vllm", "server", "vLLM bare", {"use_vllm": True, "vllm_mode": "server"},
                      distributions=("vllm",))
    failing = {field for field, check in FIELD_CHECKS.items() if not _passes(check, bare)}
    assert failing >= {"name", "label", "versions", "install", "serve_command", "faces"}


def _passes(check: Callable[[EngineSpec], bool], spec: EngineSpec) -> bool:
    try:
        return check(spec)
    except Exception:  # noqa: BLE001 - any failure of a check on an incomplete row counts as failing
        return False


def test_installed_reads_package_metadata(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The one "is it installed?": a distribution's metadata, never an import."""
    spec = EngineSpec("fake", None, "fake", {}, distributions=("rlhf-fake-engine",))
    assert installed(spec) is None
    metadata = tmp_path / "rlhf_fake_engine-1.2.3.dist-info" / "METADATA"
    metadata.parent.mkdir()
    metadata.write_text("Metadata-Version: 2.1\nName: rlhf-fake-engine\nVersion: 1.2.3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert installed(spec) == ("rlhf-fake-engine", "1.2.3")
