"""Ports on this machine: a free block for a stack's services, and whether one is taken."""

from __future__ import annotations

import random
import socket


def free_block(n: int) -> int:
    """A base port with n consecutive free ports after it."""
    for _ in range(200):
        base = random.randint(20000, 60000)
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                s.bind(("127.0.0.1", p))
                socks.append(s)
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free block of ports")


def port_in_use(port: int) -> bool:
    """Whether something listens on ``port`` (any address), tried as the services bind it: SO_REUSEADDR, so a
    port whose old connections linger in TIME_WAIT counts as free, as it is for them."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return True
    return False
