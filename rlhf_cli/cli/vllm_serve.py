"""`rlhf vllm-serve ALGO -r RECIPE`: the vLLM server a `vllm_mode: server` run generates with, matching the run.

It resolves the recipe as the training command does (same flags and `--set`) and starts vLLM's OpenAI-compatible
server on the run's policy, dtype, context length, tensor parallelism and port. The server listens on loopback
(127.0.0.1) unless `--host` says otherwise, with vLLM's development endpoints on (VLLM_SERVER_DEV_MODE=1): the
run refreshes the server's weights through `/collective_rpc` (rlhf_cli/rank/engines/vllm/server.py). TRL's own
`trl vllm-serve` needs CUDA (and the package named `vllm`); this needs neither.
"""

from __future__ import annotations

import os
import shlex
import sys
from typing import Annotated, Any, Optional

import typer

from rlhf_cli.cli.flags import TABLE, given_once
from rlhf_cli.config.engines.vllm import LOGPROBS_MODE
from rlhf_cli.errors import RlhfError
from rlhf_cli.models.dtype import training_dtype

EXAMPLE = "rlhf vllm-serve ppo -r ppo/smoke --port 8000"
LOOPBACK = "127.0.0.1"
# the weight refresh's disk reload, tied layers re-processed (rlhf_cli/rank/engines/vllm/worker_extension.py; by
# name: the CLI imports no rank code)
WORKER_EXTENSION = "rlhf_cli.rank.engines.vllm.worker_extension.ReloadWithTiedLayers"


def _training_option(parameter: str) -> Any:
    """The training commands' own option (rlhf_cli/cli/flags.py), for the flags this command shares with them:
    every occurrence, so that `given_once` refuses one given twice there too."""
    return next(row for row in TABLE if row.parameter == parameter).parameter_of_command().annotation


RecipeOpt, ModelOpt, SetOpt, DryRunOpt = (_training_option(name) for name in ("recipe", "model", "set_", "dry_run"))
HostOpt = Annotated[str, typer.Option("--host", help="Address to listen on; loopback unless you need more.")]
PortOpt = Annotated[Optional[int], typer.Option(
    "--port", show_default=False, help="Port to listen on. Default: the run's vllm_server_port.")]


def server_command(run: Any, host: str, port: int | None, dtype: str) -> list[str]:
    """vLLM's server on the run's policy, lengths, dtype, tensor parallelism, memory share and seed."""
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(run.value("model_name_or_path")),
            "--host", host, "--port", str(port or run.value("vllm_server_port")),
            "--dtype", dtype,
            "--tensor-parallel-size", str(run.value("vllm_tensor_parallel_size")),
            "--gpu-memory-utilization", str(run.value("vllm_gpu_memory_utilization")),
            "--seed", str(run.value("seed")),
            "--logprobs-mode", LOGPROBS_MODE,  # what PPO's importance sampling compares with the policy's
            "--worker-extension-cls", WORKER_EXTENSION]
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
    dry_run: DryRunOpt = 0,
) -> None:
    """Start the vLLM server for a `vllm_mode: server` run of this recipe; Ctrl-C stops it."""
    from rlhf_cli.config.resolve import RunRequest, resolve
    from rlhf_cli.config.engines.vllm import INSTALL, installed_vllm, trl_server_command

    given, problems = given_once({"recipe": recipe, "model": model, "set_": set_, "dry_run": dry_run})
    recipe, model, dry_run = given["recipe"], given["model"], given["dry_run"]
    flags = {"model_name_or_path": ("--model", model)} if model else {}
    if not (installed_vllm() or dry_run):
        problems.append(f"rlhf vllm-serve: vLLM is not installed; install it with {INSTALL}")
    run = resolve(RunRequest(ctx.info_name.replace("-", "_"), recipe, flags, tuple(set_ or ()), False,
                             planning=True, problems=tuple(problems)))
    dtype = training_dtype(run.value("bf16"), run.value("fp16"), (run.value("model_init_kwargs") or {}).get("dtype"),
                           run.value("model_name_or_path"))
    if run.algorithm != "ppo":
        raise RlhfError(f"rlhf vllm-serve {ctx.info_name}: {ctx.info_name} syncs its server through TRL's own weight "
                        "transfer (NCCL: CUDA on both sides), which this server does not set up; start TRL's: "
                        f"{shlex.join(trl_server_command(run.value, host, port, dtype))}")
    argv = server_command(run, host, port, dtype)
    if dry_run:
        print(shlex.join(argv))
        return
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}
    os.execve(sys.executable, argv, env)  # the server is this process: its output, Ctrl-C and exit code
