"""The vLLM side: aiohttp's session, the lean client, served-name discovery, the engine probe."""
