"""The vLLM server a run's ranks will talk to (`vllm_mode: server`), checked before launch: its URL parses, its
host resolves and can be reached, and what answers speaks HTTP. Otherwise every rank loads its model, then waits
`vllm_server_timeout` seconds (240 by default) and dies. A server that is not up yet (the connection is refused) is
a warning: it may be starting beside the job. Pure Python: sockets only, never vLLM or requests.
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

from rlhf_cli.config.fields import is_host

CONNECT_SECONDS = 3.0  # what the check may cost a launch: a reachable host answers a connect in far less


def server_url(values: dict, said: str) -> tuple[str, str]:
    """The URL TRL's VLLMClient will use (base_url, else host and port), and how the problem names it."""
    if values.get("vllm_server_base_url"):
        return str(values["vllm_server_base_url"]), f"{said}: `vllm_server_base_url`"
    host, port = values.get("vllm_server_host", "0.0.0.0"), values.get("vllm_server_port", 8000)
    return f"http://{host}:{port}", f"{said}: `vllm_server_host` and `vllm_server_port`"


def server_problems(url: str, where: str, timeout: float) -> tuple[list[str], list[str]]:
    """(problems, warnings) of the server at `url`; `timeout`: how long the ranks would wait for it."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return [f"{where}: {url!r} is not an http:// or https:// URL with a host; give one like "
                "http://10.0.0.5:8000"], []
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return [f"{where}: {url!r} has no valid port (1 to 65535)"], []
    if not is_host(parts.hostname):
        return [f"{where}: {parts.hostname!r} is neither an IP address nor a host name"], []
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
        if parts.scheme == "http" and not _speaks_http(probe, parts.hostname):
            return [f"{where}: {parts.hostname}:{port} answers, but not as an HTTP server; is it the port "
                    "`rlhf vllm-serve` listens on?"], []
    return [], []


def _speaks_http(connection: socket.socket, host: str) -> bool:
    """Whether a GET of the health route gets an HTTP reply (any status)."""
    try:
        connection.sendall(f"GET /health HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
        return connection.recv(5).startswith(b"HTTP/")
    except OSError:
        return False
