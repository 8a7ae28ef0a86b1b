"""vllm-sidecar: a reverse proxy for vLLM that resolves model names and never fails silently."""

__version__ = "0.1.0"
