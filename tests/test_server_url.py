"""vLLM's server mode checked before launch: what answers at the URL speaks HTTP, a closed port is a warning (the
server may be starting beside the job), and `--dry-run` and the launch judge it alike."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from helpers import free_port
from rlhf_cli.config.engines.vllm_server import server_problems


@pytest.fixture
def listener():
    """A local TCP server answering each connection with `reply` (None: HTTP's own)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    replies = {"reply": b"SSH-2.0-OpenSSH_9.6\r\n"}

    def serve() -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            with connection:
                connection.recv(1024)
                connection.sendall(replies["reply"])

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1], replies
    server.close()


def test_a_port_that_answers_but_not_http_is_refused(listener) -> None:
    port, replies = listener
    problems, warnings = server_problems(f"http://127.0.0.1:{port}", "w", 240)
    assert problems == [f"w: 127.0.0.1:{port} answers, but not as an HTTP server; is it the port `rlhf vllm-serve` "
                        "listens on?"] and warnings == []
    replies["reply"] = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    assert server_problems(f"http://127.0.0.1:{port}/", "w", 240) == ([], [])


def test_a_closed_port_is_a_warning_that_says_how_long_the_ranks_wait(cli, nothing_launches, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()  # nothing listens there
    args = ("grpo", "-r", "grpo/smoke", "-o", tmp_path / "out", "--vllm", "server", "--set",
            f"vllm_server_base_url=http://127.0.0.1:{port}", "--set", "vllm_server_timeout=30")
    metadata = tmp_path / "site" / "vllm-0.30.0.dist-info" / "METADATA"  # shown as installed; never imported
    metadata.parent.mkdir(parents=True)
    metadata.write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.30.0\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    for extra in (("--dry-run",), ()):  # one set of checks: what the dry run says, the launch says
        result = cli(*args, *extra)
        assert result.exit_code == 0, result.output
        said = " ".join(result.output.split())
        assert f"nothing listens at http://127.0.0.1:{port} yet; the ranks will wait up to 30 s" in said
        assert "grpo syncs the server through TRL's own weight transfer" in said  # not rlhf vllm-serve's
    assert len(nothing_launches) == 1
