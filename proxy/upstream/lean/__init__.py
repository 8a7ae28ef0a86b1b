"""The lean upstream client: HTTP/1.1 on llhttp, failing with aiohttp's exceptions for its faults.

`hop.py` takes it for --upstream-client lean (the default). Its modules, each importing only
those below it:

- `client`: `LeanClient`, each request written as one buffer on a pooled connection, and the
  `Answer` the relay reads (the part of aiohttp's ClientResponse it uses).
- `pool`: the keep-alive pool: last in, first out, idle ones dropped at 4 s, bounded.
- `connection`: one kept-alive connection, the asyncio.Protocol: its socket, a request's bytes
  out, backpressure both ways, and an idle connection that receives bytes closed.
- `reader`: llhttp's callbacks: the answer to the request on a connection, its head within
  aiohttp's bounds, its framing, and whether the connection may carry another.
- `body`: an answer's body as it arrives, with backpressure on the connection.

`..marks` is not here: aiohttp's client marks its requests for `session.classify` the same way.
Outside `proxy.upstream` only this surface is imported (a `protected` contract in pyproject.toml).
"""

from .client import Answer, LeanClient

__all__ = ["Answer", "LeanClient"]
