"""vLLM's server mode checked before launch: what answers at the URL speaks HTTP, a closed port is a warning (the
server may be starting beside the job), and `--dry-run` and the launch judge it alike."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path

import pytest

from helpers import free_port
from rlhf_cli.config.engines.vllm_server import server_lora_problem, server_problems


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


def _http(status: int, body: bytes = b"") -> bytes:
    return b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n\r\n%s" % (status, len(body), body)


MODELS = b'{"object": "list", "data": [{"id": "policy", "object": "model"}]}'


def test_only_what_answers_as_a_vllm_server_passes(listener) -> None:
    port, replies = listener
    for reply, said in ((b"SSH-2.0-OpenSSH_9.6\r\n", "answers, but not as an HTTP server"),
                        (_http(404), "answers GET /health with HTTP 404, where a vLLM server answers 200"),
                        (_http(200, b"<html>an index</html>"), "answers GET /v1/models without a model list")):
        replies["reply"] = reply
        problems, warnings = server_problems(f"http://127.0.0.1:{port}", "w", 240)
        assert len(problems) == 1 and problems[0].startswith(f"w: 127.0.0.1:{port} {said}"), problems
        assert warnings == []
    replies["reply"] = _http(200, MODELS)
    assert server_problems(f"http://127.0.0.1:{port}/v1", "w", 240) == ([], [])


def test_an_address_that_is_no_server_address_is_one_line() -> None:
    for url, said in (("http://[::1", "is not a valid URL"), ("http://127.0.0.1:0", "has port 0"),
                      ("http://127.0.0.1:99999", "has no valid port"), ("ftp://h", "is not an http://")):
        problems, warnings = server_problems(url, "w", 240)
        assert problems == [problems[0]] and said in problems[0] and "\n" not in problems[0] and warnings == []


def test_the_ranks_wait_for_a_server_answering_other_than_200_ends_at_its_timeout(listener,
                                                                                   monkeypatch) -> None:
    """TRL's own wait retries a 404 forever; a rank's client gives up after `vllm_server_timeout`, whatever
    answers, and says what did."""
    pytest.importorskip("vllm")
    import time

    from trl.generation.vllm_client import VLLMClient

    from rlhf_cli.compat.vllm import replace_trl_server_wait
    from rlhf_cli.rank.engines.vllm.server import wait_for_server

    port, replies = listener
    replies["reply"] = _http(404)
    monkeypatch.setattr(VLLMClient, "check_server", VLLMClient.check_server)  # put back after the test
    replace_trl_server_wait(wait_for_server)
    started = time.monotonic()
    with pytest.raises(ConnectionError, match=r"within 3 s .*last: HTTP 404"):
        VLLMClient(base_url=f"http://127.0.0.1:{port}", connection_timeout=3)
    assert time.monotonic() - started < 30  # TRL's own wait would never end


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
        assert "weights reach the server through a shared directory" in said and "rlhf vllm-serve grpo" in said
    assert len(nothing_launches) == 1



def test_a_run_whose_lora_the_server_serves_needs_a_server_started_with_lora_at_its_rank(listener) -> None:
    """`/server_info` (vLLM's development endpoint) says whether the server has vLLM's LoRA, and up to which rank:
    without it, or below the run's rank, the run is refused with the restart that fixes it."""
    port, replies = listener
    url = f"http://127.0.0.1:{port}"
    for lora, said in ((None, "the server was started without LoRA"), ({"max_lora_rank": 8}, "up to rank 8, below")):
        replies["reply"] = _http(200, json.dumps({"vllm_config": {"lora_config": lora}}).encode())
        problem = server_lora_problem(url, "w", 16, "grpo")
        assert problem.startswith("w: ") and said in problem and "rlhf vllm-serve grpo" in problem, problem
    replies["reply"] = _http(200, json.dumps({"vllm_config": {"lora_config": {"max_lora_rank": 16}}}).encode())
    assert server_lora_problem(url, "w", 16, "grpo") is None
    replies["reply"] = _http(404)  # no development endpoints: the sync says why, with the rest of it
    assert server_lora_problem(url, "w", 16, "grpo") is None
