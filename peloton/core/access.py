"""Who calls: the identity the API edge established for an RPC.

A :class:`Caller` is made by the daemon's authentication (a client certificate's subject, a
static token, a verified JWT) and read by authorization and the audit trail; it is plain data
so that every layer can hold one.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Caller:
    """An authenticated client: its user name, its groups and how it proved them.

    ``via`` is ``"certificate"``, ``"token"``, ``"jwt"``, or ``"none"`` for the anonymous caller
    of a daemon that runs without authentication (``name`` is then empty)."""

    name: str
    groups: frozenset[str] = field(default_factory=frozenset)
    via: str = "none"

    @property
    def anonymous(self) -> bool:
        return self.via == "none"

    def __str__(self) -> str:
        return self.name or "anonymous"


# The caller of every RPC on a daemon without authentication.
ANONYMOUS = Caller("", frozenset(), "none")
