"""The upstream side: the vLLM session, the lean hop, served-name discovery, the engine probe."""
