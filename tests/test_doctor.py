"""`rlhf doctor`: the real checks on this machine, and simulated problems that must be reported."""

from __future__ import annotations

import json
import os
import shutil
import stat
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from rlhf_cli.machine import readiness as doctor


@pytest.fixture(autouse=True)
def fresh_gpu_lookup():
    doctor.gpus.cache_clear()
    yield
    doctor.gpus.cache_clear()


def _by_name(checks: list) -> dict:
    return {check.name: check for check in checks}


def _fake_tool(directory: Path, name: str, script: str) -> None:
    path = directory / name
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_the_real_doctor_reports_every_check_and_only_real_problems(cli) -> None:
    result = cli("doctor", "--json")
    checks = {check["name"]: check for check in json.loads(result.stdout)}
    assert {"python", "torch", "transformers", "trl", "deepspeed", "accelerate", "datasets", "typer", "GPUs",
            "C++ compiler", "ninja", "DeepSpeed accelerator", "hub", "hub cache", "environment"} <= checks.keys()
    problems = {name for name, check in checks.items() if check["status"] == "problem"}
    assert result.exit_code == (1 if problems else 0)
    for name in problems:  # a problem must be true of this machine
        if name == "C++ compiler":
            assert not any(shutil.which(tool) for tool in ("c++", "g++", "clang++"))
        elif name == "ninja":
            assert shutil.which("ninja") is None
        else:
            pytest.fail(f"unexpected problem on the test machine: {checks[name]}")
    assert checks["hub"] == {"name": "hub", "status": "ok", "detail": "skipped: HF_HUB_OFFLINE is set"}
    assert checks["hub cache"]["detail"].startswith(os.environ["HF_HOME"])
    if not shutil.which("nvidia-smi") and not Path("/dev/nvidia0").exists():
        assert checks["GPUs"]["status"] == "warning" and "CPU only" in checks["GPUs"]["detail"]


def test_a_version_outside_the_pinned_range_is_a_problem_and_exit_1(cli, monkeypatch) -> None:
    real = doctor._installed_version
    monkeypatch.setattr(doctor, "_installed_version", lambda name: "2.0.1" if name == "torch" else real(name))
    monkeypatch.setattr(doctor, "CHECKS", (doctor.check_packages,))
    result = cli("doctor")
    assert result.exit_code == 1
    line = next(line for line in result.stdout.splitlines() if " torch " in line)
    assert line.split()[:3] == ["problem", "torch", "2.0.1"] and "outside the tested range" in line
    assert "1 problem," in result.stdout


def test_a_missing_package_is_a_problem(monkeypatch) -> None:
    def missing(name: str) -> str:
        raise doctor.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(doctor, "_installed_version", missing)
    trl = _by_name(doctor.check_packages())["trl"]
    assert trl.status == "problem" and trl.detail.startswith("not installed; pip install 'trl>=")


def test_no_compiler_and_no_ninja_on_path_are_problems(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    checks = _by_name(doctor.check_build_tools())
    assert checks["C++ compiler"].status == "problem" and "install g++" in checks["C++ compiler"].detail
    assert checks["ninja"].status == "problem" and "pip install ninja" in checks["ninja"].detail
    assert "CUDA compiler" not in checks  # only asked for on a GPU node


def test_gpus_from_nvidia_smi_and_a_missing_cuda_compiler(monkeypatch, tmp_path: Path) -> None:
    _fake_tool(tmp_path, "nvidia-smi", "echo 'NVIDIA H100 80GB HBM3, 81559'; echo 'NVIDIA H100 80GB HBM3, 81559'")
    _fake_tool(tmp_path, "g++", "true")
    _fake_tool(tmp_path, "ninja", "true")
    monkeypatch.setenv("PATH", str(tmp_path))
    for variable in ("CXX", "CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(variable, raising=False)
    assert _by_name(doctor.check_gpus())["GPUs"].detail == "2: NVIDIA H100 80GB HBM3 (80 GiB)"
    checks = _by_name(doctor.check_build_tools())
    assert checks["C++ compiler"].status == "ok" and checks["ninja"].status == "ok"
    if not Path("/usr/local/cuda/bin/nvcc").exists():
        assert checks["CUDA compiler"].status == "warning" and "nvcc" in checks["CUDA compiler"].detail
    _fake_tool(tmp_path, "nvcc", "true")
    assert _by_name(doctor.check_build_tools())["CUDA compiler"] == doctor.Check("CUDA compiler", "ok",
                                                                                str(tmp_path / "nvcc"))


def test_an_nvidia_smi_that_lists_nothing_is_named(monkeypatch, tmp_path: Path) -> None:
    _fake_tool(tmp_path, "nvidia-smi", "echo 'NVIDIA-SMI has failed' >&2; exit 9")
    monkeypatch.setenv("PATH", str(tmp_path))
    [check] = doctor.check_gpus()
    assert check.status == "warning" and "nvidia-smi lists none" in check.detail


def test_the_accelerator_named_by_ds_accelerator(monkeypatch) -> None:
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    assert doctor.check_accelerator() == [doctor.Check("DeepSpeed accelerator", "ok", "cpu (DS_ACCELERATOR)")]


class _Hub(BaseHTTPRequestHandler):
    def do_HEAD(self) -> None:
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def test_hub_reachable_unreachable_and_offline(monkeypatch) -> None:
    server = HTTPServer(("127.0.0.1", 0), _Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.delenv("HF_HUB_OFFLINE")
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
        [reachable] = doctor.check_hub()
        assert reachable.status == "ok" and "reachable (HTTP 200" in reachable.detail
    finally:
        server.shutdown()
        server.server_close()
    [unreachable] = doctor.check_hub()  # the port is closed now
    assert unreachable.status == "warning" and "not reachable" in unreachable.detail


def test_hub_cache_location_and_size(monkeypatch, tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    (cache / "models--a--b" / "blobs").mkdir(parents=True)
    (cache / "models--a--b" / "blobs" / "x").write_bytes(b"0" * 3000)
    (cache / "models--a--b" / "snapshot").symlink_to(cache / "models--a--b" / "blobs" / "x")  # not counted twice
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    [check] = doctor.check_hub_cache()
    assert check.status == "ok" and check.detail.startswith(f"{cache} (2.9 KiB; ")


def test_a_hub_cache_under_a_file_is_a_problem(cli, tmp_path, monkeypatch) -> None:
    """HF_HOME a file: every download and load would fail, so doctor must not say ok."""
    (tmp_path / "hf").write_text("not a directory")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    from rlhf_cli.machine.readiness import PROBLEM, check_hub_cache

    [check] = check_hub_cache()
    assert check.status == PROBLEM and f"{tmp_path / 'hf'} is not a directory; point HF_HOME" in check.detail


def test_doctor_refuses_what_training_refuses_in_the_environment(cli, tmp_path, monkeypatch) -> None:
    """TORCH_EXTENSIONS_DIR a file stops every launch; doctor says so too, with the launch's own line."""
    (tmp_path / "ext").write_text("not a directory")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    result = cli("doctor", "--json")
    found = [check for check in json.loads(result.stdout) if check["name"] == "environment"]
    assert result.exit_code == 1 and found == [{"name": "environment", "status": "problem", "detail":
                                                f"TORCH_EXTENSIONS_DIR={tmp_path / 'ext'} is not a directory; point "
                                                "it at a directory (made if missing)"}]
    launch = cli("rloo", "-r", "rloo/smoke", "-o", tmp_path / "out", "--dry-run")
    assert launch.exit_code == 2 and found[0]["detail"] in " ".join(launch.output.split())
