"""Why a call was refused UNAUTHENTICATED."""

from __future__ import annotations

from peloton.errors import Unauthenticated


class AuthFailure(Unauthenticated):
    """A call refused UNAUTHENTICATED: ``reason`` labels it in ``peloton_auth_failures_total``
    (``no_credentials``, ``token_unknown``, ``jwt_expired``, ``jwt_invalid``), the message is
    the one sentence the client gets (it never repeats the token)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
