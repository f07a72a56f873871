"""Domain errors. Each maps to one gRPC status code in :mod:`peloton.api.interceptor`."""

from __future__ import annotations


class PelotonError(Exception):
    """Base of every error peloton reports to a caller."""


class InvalidArgument(PelotonError):
    """A request or spec field is malformed; ``field`` names it (dotted path)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}" if field else reason)
        self.field = field
        self.reason = reason


class NotFound(PelotonError):
    """The named object does not exist."""


class AlreadyExists(PelotonError):
    """An object with this identity exists with different content."""


class FailedPrecondition(PelotonError):
    """The action is illegal in the object's current state."""


class Conflict(PelotonError):
    """A concurrent writer changed the object first (optimistic concurrency); retry."""


class Unavailable(PelotonError):
    """A dependency (database, Mesos) cannot be reached now."""


class ResourceExhausted(PelotonError):
    """A per-client or server-wide quota (e.g. open watches) is used up; retry later."""


class Unauthenticated(PelotonError):
    """The call carries no identity the daemon accepts (no or a bad certificate or token)."""


class PermissionDenied(PelotonError):
    """The caller is known but lacks the permission the call needs; the message names the
    caller, the permission and the pool."""
