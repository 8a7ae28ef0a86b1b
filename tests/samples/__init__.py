"""Raw exchanges captured from a real vLLM's two HTTP frontends (tests/samples/capture.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
FRONTENDS = ("python", "rust")


@dataclass(frozen=True)
class Sample:
    """One answer: its status, headers (names lower-cased) and body (de-chunked), and the raw
    body as it came (`chunks`: each chunk of a chunked answer, as the frontend wrote it)."""

    status: int
    headers: dict[str, str]
    body: bytes
    chunks: list[bytes]


def sample(frontend: str, name: str) -> Sample:
    raw = (HERE / frontend / f"{name}.txt").read_bytes().split(b"\n", 1)[1]  # the "###" line
    head, _, rest = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode().split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
    chunks = _dechunk(rest) if headers.get("transfer-encoding") == "chunked" else [rest]
    return Sample(int(status_line.split()[1]), headers, b"".join(chunks), chunks)


def _dechunk(data: bytes) -> list[bytes]:
    chunks, at = [], 0
    while True:
        end = data.index(b"\r\n", at)
        size = int(data[at:end].split(b";")[0], 16)
        if size == 0:
            return chunks
        chunks.append(data[end + 2 : end + 2 + size])
        at = end + 2 + size + 2
