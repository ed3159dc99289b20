"""The vLLM server a run's ranks will talk to (`vllm_mode: server`), checked before launch: its URL parses, its host
resolves and can be reached, and what answers is a vLLM server: `/health` answers 200, then `/v1/models` lists a
model, as TRL's client asks them, and, where the run's LoRA is served by vLLM itself
(rlhf_cli/config/engines/vllm_lora.py), `/server_info` shows LoRA on at the run's rank. Otherwise every rank loads
its model, then waits `vllm_server_timeout` seconds (240 by default) and dies. A server that is not up yet (the
connection is refused) is a warning: it may be starting beside the job. Pure Python: sockets and http.client only,
never vLLM or requests.
"""

from __future__ import annotations

import json
import socket
from http.client import HTTPConnection, HTTPException, HTTPSConnection
from typing import Any
from urllib.parse import SplitResult, urlsplit

from rlhf_cli.config.fields import is_host

CONNECT_SECONDS = 3.0  # what the check may cost a launch: a reachable host answers a connect in far less
ANSWER_SECONDS = 10.0  # a vLLM server answers /health and /v1/models at once, even while it generates
MAX_ANSWER_BYTES = 2**20  # a model list is short; a server sending more is not one


def server_url(values: dict, said: str) -> tuple[str, str]:
    """The URL TRL's VLLMClient will use (base_url, else host and port), and how the problem names it."""
    if values.get("vllm_server_base_url"):
        return str(values["vllm_server_base_url"]), f"{said}: `vllm_server_base_url`"
    host, port = values.get("vllm_server_host", "0.0.0.0"), values.get("vllm_server_port", 8000)
    return f"http://{host}:{port}", f"{said}: `vllm_server_host` and `vllm_server_port`"


def server_problems(url: str, where: str, timeout: float) -> tuple[list[str], list[str]]:
    """(problems, warnings) of the server at `url`; `timeout`: how long the ranks would wait for it."""
    parts, problem = _parsed(url, where)
    if problem:
        return [problem], []
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        address = socket.getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)[0][4]
    except (OSError, UnicodeError) as error:
        return [f"{where}: host {parts.hostname} does not resolve ({error.strerror or error}); give the server's "
                "address"], []
    family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.settimeout(CONNECT_SECONDS)
        try:
            probe.connect(address[:2] if family == socket.AF_INET else address)
        except ConnectionRefusedError:
            return [], [f"warning: {where}: nothing listens at {url} yet; the ranks will wait up to "
                        f"{timeout:g} s (`vllm_server_timeout`) for `rlhf vllm-serve` to start there"]
        except OSError as error:
            reason = "no answer" if isinstance(error, TimeoutError) else (error.strerror or str(error)).lower()
            return [f"{where}: {parts.hostname}:{port} cannot be reached ({reason} within {CONNECT_SECONDS:g} s); "
                    f"the ranks would wait {timeout:g} s for it and stop: start the server, or fix the address"], []
    problem = _vllm_answer(parts, port, where)
    return ([problem] if problem else []), []


def _parsed(url: str, where: str) -> tuple[SplitResult, str]:
    """The URL's parts, or the line that says why it is no server address."""
    try:
        parts = urlsplit(url)
    except ValueError as error:  # `http://[::1`
        return SplitResult("", "", "", "", ""), f"{where}: {url!r} is not a valid URL ({error}); give one like " \
            "http://10.0.0.5:8000"
    try:
        port = parts.port
    except ValueError:
        return parts, f"{where}: {url!r} has no valid port (1 to 65535)"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return parts, f"{where}: {url!r} is not an http:// or https:// URL with a host; give one like " \
            "http://10.0.0.5:8000"
    if port == 0:
        return parts, f"{where}: {url!r} has port 0, where no server listens; give the port (1 to 65535)"
    if not is_host(parts.hostname):
        return parts, f"{where}: {parts.hostname!r} is neither an IP address nor a host name"
    return parts, ""


def _vllm_answer(parts: SplitResult, port: int, where: str) -> str:
    """What is wrong with what answers at the address, asked as the ranks will ask (TRL's VLLMClient: `/health`
    until 200, then `/v1/models`, under the URL's path); "" when it answers as a vLLM server."""
    connection_class = HTTPSConnection if parts.scheme == "https" else HTTPConnection
    base = parts.path  # TRL appends each route to the URL as written
    for route in ("/health", "/v1/models"):
        connection = connection_class(parts.hostname, port, timeout=ANSWER_SECONDS)
        try:
            connection.request("GET", base + route)
            response = connection.getresponse()
            status, body = response.status, response.read(MAX_ANSWER_BYTES)
        except (OSError, HTTPException) as error:
            return (f"{where}: {parts.hostname}:{port} answers, but not as an HTTP server "
                    f"({error or type(error).__name__}); is it the port `rlhf vllm-serve` listens on?")
        finally:
            connection.close()
        if status != 200:
            return (f"{where}: {parts.hostname}:{port} answers GET {base + route} with HTTP {status}, where a vLLM "
                    "server answers 200: the ranks would wait for it and stop; give the address `rlhf vllm-serve` "
                    "listens on" + (", without the trailing /" if base.endswith("/") else ""))
        if route == "/v1/models" and not _lists_a_model(body):
            return (f"{where}: {parts.hostname}:{port} answers GET {base + route} without a model list: it is not "
                    "a vLLM server; give the address `rlhf vllm-serve` listens on")
    return ""


def _lists_a_model(body: bytes) -> bool:
    """Whether an OpenAI `/v1/models` reply names a model (TRL's client reads `data[0].id`)."""
    try:
        models = json.loads(body).get("data")
        return isinstance(models, list) and bool(models) and isinstance(models[0], dict) and "id" in models[0]
    except (ValueError, AttributeError):
        return False


def served_lora_problem(vllm_config: Any, max_rank: int, where: str, command: str) -> str | None:
    """Why a server whose configuration (`/server_info`'s `vllm_config`, as JSON) is `vllm_config` cannot serve a
    run's adapters of rank up to `max_rank`, or None; `command`: the algorithm, for the fix."""
    lora = vllm_config.get("lora_config") if isinstance(vllm_config, dict) else None
    restart = f"restart it with `rlhf vllm-serve {command}` and the run's recipe, flags and --lora"
    if not isinstance(lora, dict):
        return (f"{where}: the run trains LoRA adapters, which the vLLM server serves itself (only the adapters "
                f"are sent after the first sync), but the server was started without LoRA: {restart}")
    if int(lora.get("max_lora_rank") or 0) < max_rank:
        return (f"{where}: the vLLM server serves LoRA up to rank {lora.get('max_lora_rank')}, below the run's "
                f"(vLLM rank {max_rank}): {restart} (and the run's lora_r)")
    return None


def server_lora_problem(url: str, where: str, max_rank: int, command: str) -> str | None:
    """`served_lora_problem` of the server at `url`, asked as the ranks ask (`/server_info`, a development
    endpoint `rlhf vllm-serve` turns on); None where it does not answer it (the sync says why then)."""
    parts, problem = _parsed(url, where)
    if problem:
        return None
    connection_class = HTTPSConnection if parts.scheme == "https" else HTTPConnection
    connection = connection_class(parts.hostname, parts.port or (443 if parts.scheme == "https" else 80),
                                  timeout=ANSWER_SECONDS)
    try:
        connection.request("GET", parts.path + "/server_info?config_format=json")
        response = connection.getresponse()
        status, body = response.status, response.read(MAX_ANSWER_BYTES * 16)
    except (OSError, HTTPException):
        return None
    finally:
        connection.close()
    try:
        info = json.loads(body) if status == 200 else None
    except ValueError:
        return None
    return served_lora_problem(info.get("vllm_config"), max_rank, where, command) if isinstance(info, dict) else None
