"""`rlhf vllm-serve ALGO -r RECIPE`: the vLLM server a `vllm_mode: server` run generates with, matching the run.

It resolves the recipe as the training command does (same flags and `--set`) and starts vLLM's OpenAI-compatible
server on the run's policy, dtype, context length, tensor parallelism and port. The server listens on loopback
(127.0.0.1) unless `--host` says otherwise, with vLLM's development endpoints on (VLLM_SERVER_DEV_MODE=1): the run
refreshes the server's weights through `/collective_rpc` (rlhf_cli/rank/engines/vllm/server.py), whichever algorithm
it trains (PPO, RLOO, GRPO, online DPO). A run with LoRA (`--lora`, or the recipe's `use_peft`) whose adapters vLLM
can serve (rlhf_cli/config/engines/vllm_lora.py) gets vLLM's LoRA on at the run's rank, with runtime adapter loading
(VLLM_ALLOW_RUNTIME_LORA_UPDATING=1): the run sends the base once, then only the adapters. TRL's own
`trl vllm-serve` needs CUDA (and the package named `vllm`); this needs neither.
"""

from __future__ import annotations

import errno
import os
import shlex
import socket
import sys
from typing import Annotated, Any, Optional

import typer

from rlhf_cli.cli.flags import TABLE, given_once, switch_settings
from rlhf_cli.config.engines.vllm import LOGPROBS_MODE
from rlhf_cli.config.engines.vllm_lora import LoraServing, run_lora_serving
from rlhf_cli.errors import RlhfError
from rlhf_cli.launch.module_start import module_argv
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


RecipeOpt, ModelOpt, SetOpt, DryRunOpt, LoraOpt, NoLoraOpt, LoraRankOpt = (
    _training_option(name) for name in ("recipe", "model", "set_", "dry_run", "lora", "no_lora", "lora_r"))
HostOpt = Annotated[str, typer.Option("--host", help="Address to listen on; loopback unless you need more.")]
PortOpt = Annotated[Optional[int], typer.Option(
    "--port", show_default=False, help="Port to listen on. Default: the run's vllm_server_port.")]


def server_command(run: Any, host: str, port: int | None, dtype: str, lora: LoraServing | None = None) -> list[str]:
    """vLLM's server on the run's policy, lengths, dtype, tensor parallelism, memory share and seed; with vLLM's
    LoRA, one adapter at a time up to the run's rank, where `lora` says it serves the run's adapters."""
    argv = [*module_argv(sys.executable, "vllm.entrypoints.openai.api_server"),
            "--model", str(run.value("model_name_or_path")),
            "--host", host, "--port", str(port if port is not None else run.value("vllm_server_port")),
            "--dtype", dtype,
            "--tensor-parallel-size", str(run.value("vllm_tensor_parallel_size")),
            "--gpu-memory-utilization", str(run.value("vllm_gpu_memory_utilization")),
            "--seed", str(run.value("seed")),
            "--logprobs-mode", LOGPROBS_MODE,  # what PPO's importance sampling compares with the policy's
            "--worker-extension-cls", WORKER_EXTENSION]
    length = _optional_value(run, "vllm_max_model_length")  # online DPO's config has no such key
    if length is not None:
        argv += ["--max-model-len", str(length)]
    if run.value("trust_remote_code"):
        argv.append("--trust-remote-code")
    if lora is not None and lora.served:
        argv += ["--enable-lora", "--max-lora-rank", str(lora.max_rank), "--max-loras", "1"]
    return argv


def _optional_value(run: Any, name: str) -> Any:
    """The run's value of `name`, None where its algorithm's config has no such key."""
    try:
        return run.value(name)
    except KeyError:
        return None


def listen_problem(host: str, port: int, said: str, in_use: bool) -> str | None:
    """Why vLLM could not listen at `host`:`port` (uvicorn would fail after the model loaded, or, for port 0,
    listen on a port nobody is told), or None; `in_use`: also try the port, as the server will bind it."""
    from rlhf_cli.config.fields import is_host

    if not 1 <= port <= 65535:
        return f"{said} {port}: give the port the run's ranks will use (1 to 65535)"
    if not is_host(host):
        return f"--host {host!r} is neither an IP address nor a host name"
    try:
        family, kind, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (OSError, UnicodeError) as error:
        return f"--host {host} does not resolve ({error.strerror or error})"
    if not in_use:
        return None
    with socket.socket(family, kind) as trial:
        trial.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            trial.bind(address)
        except OSError as error:
            reason = "is in use" if error.errno == errno.EADDRINUSE else f"cannot be bound ({error.strerror})"
            return f"{host}:{port} {reason}; stop what listens there, or pass another {said.split()[0]}"
    return None


def vllm_serve(
    ctx: typer.Context,
    recipe: RecipeOpt = None,
    model: ModelOpt = None,
    set_: SetOpt = None,
    host: HostOpt = LOOPBACK,
    port: PortOpt = None,
    dry_run: DryRunOpt = 0,
    lora: LoraOpt = 0,
    no_lora: NoLoraOpt = 0,
    lora_r: LoraRankOpt = None,
) -> None:
    """Start the vLLM server for a `vllm_mode: server` run of this recipe; Ctrl-C stops it."""
    from rlhf_cli.config.resolve import RunRequest, resolve
    from rlhf_cli.generation.engines import VLLM_SERVER, installed

    given, problems = given_once({"recipe": recipe, "model": model, "set_": set_, "dry_run": dry_run, "lora": lora,
                                  "no_lora": no_lora, "lora_r": lora_r})
    recipe, model, dry_run = given["recipe"], given["model"], given["dry_run"]
    switches, contradictions = switch_settings({"lora": given["lora"], "no_lora": given["no_lora"]})
    problems += contradictions
    flags = {**({"model_name_or_path": ("--model", model)} if model else {}), **switches,
             **({"lora_r": ("--lora-r", given["lora_r"])} if given["lora_r"] is not None else {})}
    if not (installed(VLLM_SERVER) or dry_run):
        problems.append(f"rlhf vllm-serve: vLLM is not installed; install it with {VLLM_SERVER.install}")
    run = resolve(RunRequest(ctx.info_name.replace("-", "_"), recipe, flags, tuple(set_ or ()), False,
                             planning=True, problems=tuple(problems)))
    dtype = training_dtype(run.value("bf16"), run.value("fp16"), (run.value("model_init_kwargs") or {}).get("dtype"),
                           run.value("model_name_or_path"))
    problem = listen_problem(host, port if port is not None else int(run.value("vllm_server_port")),
                             "--port" if port is not None else "`vllm_server_port`", in_use=not dry_run)
    if problem:
        raise RlhfError(f"rlhf vllm-serve: {problem}")
    served = run_lora_serving(run.value, run.value("model_name_or_path"), run.value("model_revision"),
                              run.value("env"))
    argv = server_command(run, host, port, dtype, served)
    if served is not None and not served.served:
        print(f"rlhf vllm-serve: LoRA without vLLM's LoRA: {served.reason}", file=sys.stderr)
    if dry_run:
        print(shlex.join(argv))
        return
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1",
           **({"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"} if served is not None and served.served else {})}
    os.execve(sys.executable, argv, env)  # the server is this process: its output, Ctrl-C and exit code
