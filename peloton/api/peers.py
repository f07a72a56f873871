"""Who a gRPC peer is, for per-client quotas and logs."""

from __future__ import annotations


def client_of(peer: str) -> str:
    """The client of a gRPC peer string (``ipv4:10.0.0.5:51234``): its address without the port,
    which changes with every connection."""
    return peer.rsplit(":", 1)[0]
