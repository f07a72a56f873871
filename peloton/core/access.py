"""Who calls, and what they may do: the identity the API edge established for an RPC, and the
pure rules of per-pool permissions.

A :class:`Caller` is made by the daemon's authentication (a client certificate's subject, a
static token, a verified JWT) and read by authorization and the audit trail; it is plain data
so that every layer can hold one. :func:`allows` decides from a pool tree's grants and the
cluster's admins (README "Pools and permissions"); no I/O, no clock.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field

from peloton.errors import InvalidArgument


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


# ---------------------------------------------------------------- permissions on pools
#
# Pure rules, no I/O: who may do what on a pool, from the grants of the pool tree and the
# cluster's admins. A caller's permission on a pool is the greatest that any grant on the pool
# or on one of its ancestors gives a principal it matches (a pool may add permissions, never
# remove them); a cluster admin is admin everywhere. The cluster itself is the root pool "/",
# which holds no grants: admin on it is being a cluster admin.

ROOT = "/"
USER = "user"
GROUP = "group"
# Longest user or group name a grant or the admins option may name.
MAX_PRINCIPAL_NAME = 128


class Permission(enum.IntEnum):
    """What a grant allows on a pool; each includes those below it (admin ⊇ submit ⊇ view)."""

    VIEW = 1  # read the pool's jobs, tasks, logs and GPUs
    SUBMIT = 2  # also create jobs there; kill, restart and delete one's own
    ADMIN = 3  # also anyone's jobs, and change the pools below it

    def __str__(self) -> str:
        return self.name.lower()


@dataclass(frozen=True, order=True)
class Principal:
    """One user or one group, as grants and the admins option name them (``user:alice``)."""

    kind: str  # USER or GROUP
    name: str

    def matches(self, caller: Caller) -> bool:
        """Whether ``caller`` is this user or belongs to this group."""
        if caller.anonymous:
            return False
        return caller.name == self.name if self.kind == USER else self.name in caller.groups

    def __str__(self) -> str:
        return f"{self.kind}:{self.name}"


@dataclass(frozen=True, order=True)
class Grant:
    """A permission given to one principal on a pool (and on every pool below it)."""

    principal: Principal
    permission: Permission

    def __str__(self) -> str:
        return f"{self.permission}={self.principal}"


# The grants of a pool tree, by pool path (pools without grants may be left out).
PoolGrants = Mapping[str, Sequence[Grant]]


def check_principal_name(name: str, field: str) -> None:
    """A user or group name: 1 to MAX_PRINCIPAL_NAME printable characters, no space and no comma
    (the admins option is a comma-separated list of them)."""
    if not name:
        raise InvalidArgument(field, "is empty; name a user or a group")
    if len(name) > MAX_PRINCIPAL_NAME:
        raise InvalidArgument(field, f"is longer than {MAX_PRINCIPAL_NAME} characters")
    if not name.isprintable() or any(c.isspace() or c == "," for c in name):
        raise InvalidArgument(field, f"{name!r} may not hold spaces, commas or control characters")


def parse_principal(text: str, field: str) -> Principal:
    """``user:NAME`` or ``group:NAME``."""
    kind, sep, name = text.strip().partition(":")
    if not sep or kind not in (USER, GROUP):
        raise InvalidArgument(field, f"{text!r} is not user:NAME or group:NAME")
    check_principal_name(name, field)
    return Principal(kind, name)


def parse_permission(text: str, field: str) -> Permission:
    """``view``, ``submit`` or ``admin`` (any case)."""
    try:
        return Permission[text.strip().upper()]
    except KeyError:
        names = ", ".join(str(p) for p in Permission)
        raise InvalidArgument(field, f"unknown permission {text!r}; one of {names}") from None


def parse_grant(text: str, field: str) -> Grant:
    """``PERMISSION=user:NAME`` or ``PERMISSION=group:NAME`` (``submit=user:alice``)."""
    permission, sep, principal = text.partition("=")
    if not sep:
        raise InvalidArgument(field, f"{text!r} is not PERMISSION=user:NAME or =group:NAME")
    return Grant(parse_principal(principal, field), parse_permission(permission, field))


def parse_admins(text: str, field: str = "admins") -> frozenset[Principal]:
    """The admins option: comma-separated principals (``user:ops,group:sre``); empty: none."""
    items = [item for item in text.split(",") if item.strip()]
    return frozenset(parse_principal(item, f"{field}[{i}]") for i, item in enumerate(items))


def lineage(path: str) -> list[str]:
    """``path`` and its ancestors up to the root: /a/b -> [/a/b, /a, /]."""
    out = [path]
    while path != ROOT:
        cut = path.rfind("/")
        path = path[:cut] if cut > 0 else ROOT  # a relative path has no parent but the root
        out.append(path)
    return out


def is_cluster_admin(caller: Caller, admins: Set[Principal]) -> bool:
    return any(p.matches(caller) for p in admins)


def permission_on(
    caller: Caller, path: str, grants: PoolGrants, admins: Set[Principal]
) -> Permission | None:
    """The greatest permission ``caller`` has on pool ``path`` (None: none), from the grants on
    it and its ancestors; admin for a cluster admin. The anonymous caller matches no grant."""
    if is_cluster_admin(caller, admins):
        return Permission.ADMIN
    found = [
        g.permission
        for pool in lineage(path)
        for g in grants.get(pool, ())
        if g.principal.matches(caller)
    ]
    return max(found, default=None)


def allows(
    caller: Caller, permission: Permission, path: str, grants: PoolGrants, admins: Set[Principal]
) -> bool:
    """Whether ``caller`` holds ``permission`` on pool ``path`` (on "/": is a cluster admin).
    A daemon without authentication (the anonymous caller) allows everything."""
    if caller.anonymous:
        return True
    held = permission_on(caller, path, grants, admins)
    return held is not None and held >= permission


def viewable(
    caller: Caller, paths: Iterable[str], grants: PoolGrants, admins: Set[Principal]
) -> frozenset[str] | None:
    """The pools of ``paths`` whose jobs ``caller`` may view; None: every pool, named or not
    (the anonymous caller of a daemon without authentication, a cluster admin)."""
    if caller.anonymous or is_cluster_admin(caller, admins):
        return None
    return frozenset(p for p in paths if allows(caller, Permission.VIEW, p, grants, admins))
