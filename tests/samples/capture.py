"""Capture raw exchanges from a real vLLM into tests/samples/<frontend>/ (`--rust`: the Rust one).

Run by hand, not by the suite: `PYTHONPATH=$PWD .venv/bin/python tests/samples/capture.py --rust`.
It starts the shared tests' vLLM (tests/vllm_servers.py's DevVllm) on the tiny model, sends each
request below over a plain socket and writes what came back, byte for byte, chunked framing
included, so that the fakes (tests/fake_vllm.py) can be checked against it.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import tempfile
from pathlib import Path

from tests.processes import running
from tests.vllm_servers import DevVllm, TinyModel, tiny_model_dir

HERE = Path(__file__).resolve().parent
PROMPT = {"prompt": "Hello", "max_tokens": 5, "temperature": 0}
N2 = {"n": 2, "temperature": 1.0, "seed": 0}  # vLLM refuses n above 1 with greedy sampling
LONG = {"max_tokens": 120, "temperature": 1.0, "seed": 0}
CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5, "temperature": 0}


ABORTED = {
    "completions": ("/v1/completions", {"prompt": "Hello"}),
    "chat": ("/v1/chat/completions", {"messages": CHAT["messages"]}),
}


def exchanges(model: str) -> dict[str, tuple[str, str, dict[str, object] | None]]:
    """Each sample's file name -> (method, path, JSON body)."""
    usage = {"stream": True, "stream_options": {"include_usage": True}}
    return {
        "a_models": ("GET", "/v1/models", None),
        "b1_completion": ("POST", "/v1/completions", {"model": model, **PROMPT}),
        "b2_completion_n2_token_ids": (
            "POST",
            "/v1/completions",
            {"model": model, **PROMPT, **N2, "return_token_ids": True},
        ),
        "c_wrong_model": ("POST", "/v1/completions", {"model": "org/nope", **PROMPT}),
        "d1_chat": ("POST", "/v1/chat/completions", {"model": model, **CHAT}),
        "d2_chat_stream": (
            "POST",
            "/v1/chat/completions",
            {"model": model, **CHAT, "stream": True},
        ),
        "d3_chat_stream_usage": ("POST", "/v1/chat/completions", {"model": model, **CHAT, **usage}),
        "d4_completions_stream": (
            "POST",
            "/v1/completions",
            {"model": model, **PROMPT, "stream": True},
        ),
        "d5_completions_stream_usage": (
            "POST",
            "/v1/completions",
            {"model": model, **PROMPT, **usage},
        ),
        "d6_completions_stream_n2_token_ids": (
            "POST",
            "/v1/completions",
            {"model": model, **PROMPT, **N2, "stream": True, "return_token_ids": True},
        ),
        "d6b_completions_stream_token_ids": (
            "POST",
            "/v1/completions",
            {"model": model, **PROMPT, "stream": True, "return_token_ids": True},
        ),
        # Long enough to meet tokens that end inside a UTF-8 character (the tiny model's
        # vocabulary is byte-level): how each frontend streams a token with no text of its own.
        "d8_chat_stream_long_usage": (
            "POST",
            "/v1/chat/completions",
            {**LONG, "model": model, "messages": CHAT["messages"], **usage},
        ),
        "d8b_completions_stream_long_usage": (
            "POST",
            "/v1/completions",
            {**LONG, "model": model, "prompt": "Hello there", **usage},
        ),
        "d9_chat_stream_logprobs": (
            "POST",
            "/v1/chat/completions",
            {"model": model, **CHAT, "stream": True, "logprobs": True},
        ),
        "d7_completions_stream_logprobs": (
            "POST",
            "/v1/completions",
            {"model": model, **PROMPT, "stream": True, "logprobs": 1},
        ),
        "e1_stream_wrong_model_chat": (
            "POST",
            "/v1/chat/completions",
            {"model": "org/nope", **CHAT, "stream": True},
        ),
        "f1_max_tokens_neg": (
            "POST",
            "/v1/completions",
            {"model": model, **PROMPT, "max_tokens": -1},
        ),
        "f2_prompt_too_long": (
            "POST",
            "/v1/completions",
            {"model": model, "prompt": "x " * 40000, "max_tokens": 5},
        ),
        "g1_malformed_json": ("POST", "/v1/completions", None),
        "g6_unknown_route": ("GET", "/v1/nope", None),
        "h1_health": ("GET", "/health", None),
        "h3_version": ("GET", "/version", None),
        "j1_is_paused": ("GET", "/is_paused", None),
        "j2_is_sleeping": ("GET", "/is_sleeping", None),
        "j3_weight_info": ("GET", "/weight_info", None),
        "j4_pause": ("POST", "/pause?mode=keep", None),
        "j5_resume": ("POST", "/resume", None),
    }


def exchange(port: int, method: str, path: str, body: dict[str, object] | None) -> bytes:
    """One request on its own connection (`Connection: close`): the raw bytes back."""
    data = b"{not json" if body is None and method == "POST" else b""
    if body is not None:
        data = json.dumps(body).encode()
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n"
    if data or method == "POST":
        head += f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        sock.sendall(head.encode() + b"\r\n" + data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rust", action="store_true", help="VLLM_USE_RUST_FRONTEND=1")
    parser.add_argument("--url", help="a vLLM already running (its port), not one started here")
    args = parser.parse_args()
    out = HERE / ("rust" if args.rust else "python")
    out.mkdir(exist_ok=True)
    model = tiny_model_dir()
    if args.url:
        capture(int(args.url.rsplit(":", 1)[1]), model.name, out)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        with running(DevVllm(TinyModel(model), Path(tmp), rust=args.rust)) as server:
            capture(server.port, model.name, out)
    return 0


def capture(port: int, model: str, out: Path) -> None:
    for name, (method, path, body) in exchanges(model).items():
        raw = exchange(port, method, path, body)
        (out / f"{name}.txt").write_bytes(f"### {method} {path}\n".encode() + raw)
        print(name, raw.split(b"\r\n", 1)[0].decode(), file=sys.stderr)
    for kind, (route, base) in ABORTED.items():
        raw = aborted(port, route, {"model": model, **base})
        (out / f"k_abort_{kind}_stream.txt").write_bytes(f"### POST {route}\n".encode() + raw)


def aborted(port: int, route: str, body: dict[str, object]) -> bytes:
    """A long stream cut by `/pause?mode=abort` once its first events are out, then resumed."""
    usage = {"stream": True, "stream_options": {"include_usage": True}}
    data = json.dumps({**body, "max_tokens": 20000, **usage}).encode()
    head = (
        f"POST {route} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        sock.sendall(head.encode() + data)
        chunks = [sock.recv(65536)]
        while chunks[-1].count(b"data: ") < 3:
            chunks.append(sock.recv(65536))
        exchange(port, "POST", "/pause?mode=abort", {})
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    exchange(port, "POST", "/resume", {})
    return b"".join(chunks)


if __name__ == "__main__":
    sys.exit(main())
