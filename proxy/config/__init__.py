"""The validated options: every CLI flag and VLLM_SIDECAR_* variable."""
