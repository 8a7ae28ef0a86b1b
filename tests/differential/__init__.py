"""The differential harness (issue 25, "two clients, one answer"): generated upstream answers and
client requests on raw sockets, through the sidecar on the lean hop, on aiohttp's client, and
through nginx, with what each end sees compared after a documented normalisation."""
