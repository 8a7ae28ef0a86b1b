"""The upstream side: the vLLM session, served-name discovery, the engine probe."""
