"""The proxy port of the pod: one SO_REUSEPORT socket per process, bound to the same address."""

from __future__ import annotations

import socket


def shared_socket(host: str, port: int, *, listen: bool) -> socket.socket:
    """A TCP socket on (host, port) with SO_REUSEPORT, so that every worker can bind the port.

    The supervisor holds one that never listens: it finds a taken port before any worker starts,
    fixes port 0 to one number, and keeps the port the pod's while a worker is restarted (the
    kernel lets only the same user join). Only listening sockets get connections."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
        if listen:
            sock.listen(1024)
            sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock
