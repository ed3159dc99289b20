"""`rlhf vllm-serve ALGO -r RECIPE`: the vLLM server a `vllm_mode: server` run generates with, matching the run.

It resolves the recipe as the training command does (same flags and `--set`) and starts vLLM's OpenAI-compatible
server on the run's policy, dtype, context length, tensor parallelism and port. The server listens on loopback
(127.0.0.1) unless `--host` says otherwise, with vLLM's development endpoints on (VLLM_SERVER_DEV_MODE=1): the
run refreshes the server's weights through `/collective_rpc` (rlhf_cli/rank/vllm_server.py). TRL's own
`trl vllm-serve` needs CUDA (and the package named `vllm`); this needs neither.
"""

from __future__ import annotations

import os
import shlex
import sys
from typing import Annotated, Any, Optional

import typer

from rlhf_cli.cli.train import DryRunOpt, ModelOpt, RecipeOpt, SetOpt

EXAMPLE = "rlhf vllm-serve ppo -r ppo/smoke --port 8000"
LOOPBACK = "127.0.0.1"
DTYPES = {(True, False): "bfloat16", (False, True): "float16", (False, False): "auto"}

HostOpt = Annotated[str, typer.Option("--host", help="Address to listen on; loopback unless you need more.")]
PortOpt = Annotated[Optional[int], typer.Option(
    "--port", show_default=False, help="Port to listen on. Default: the run's vllm_server_port.")]


def server_command(run: Any, host: str, port: int | None) -> list[str]:
    """vLLM's server on the run's policy, lengths, dtype, tensor parallelism, memory share and seed."""
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(run.value("model_name_or_path")),
            "--host", host, "--port", str(port or run.value("vllm_server_port")),
            "--dtype", DTYPES[bool(run.value("bf16")), bool(run.value("fp16"))],
            "--tensor-parallel-size", str(run.value("vllm_tensor_parallel_size")),
            "--gpu-memory-utilization", str(run.value("vllm_gpu_memory_utilization")),
            "--seed", str(run.value("seed"))]
    if run.value("vllm_max_model_length") is not None:
        argv += ["--max-model-len", str(run.value("vllm_max_model_length"))]
    if run.value("trust_remote_code"):
        argv.append("--trust-remote-code")
    return argv


def vllm_serve(
    ctx: typer.Context,
    recipe: RecipeOpt = None,
    model: ModelOpt = None,
    set_: SetOpt = None,
    host: HostOpt = LOOPBACK,
    port: PortOpt = None,
    dry_run: DryRunOpt = False,
) -> None:
    """Start the vLLM server for a `vllm_mode: server` run of this recipe; Ctrl-C stops it."""
    from rlhf_cli.config.resolve import RunRequest, resolve
    from rlhf_cli.config.vllm import INSTALL, installed_vllm

    flags = {"model_name_or_path": ("--model", model)} if model else {}
    missing = () if installed_vllm() or dry_run else (f"rlhf vllm-serve: vLLM is not installed; install it with "
                                                      f"{INSTALL}",)
    run = resolve(RunRequest(ctx.info_name.replace("-", "_"), recipe, flags, tuple(set_ or ()), False,
                             planning=True, problems=missing))
    argv = server_command(run, host, port)
    if dry_run:
        print(shlex.join(argv))
        return
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}
    os.execve(sys.executable, argv, env)  # the server is this process: its output, Ctrl-C and exit code
