"""Whether an address is this machine only: where the daemon may serve without
authentication, and where a client may send a bearer token without TLS."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an IP address, brackets allowed, or ``localhost``) is a loopback
    address: 127.0.0.0/8, ::1 or localhost."""
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False
