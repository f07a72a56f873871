"""Audit repository: the trail of mutating RPCs, appended to and read, never changed.

There is deliberately no update and no delete here; the migration's triggers refuse both at the
database as well (see ``migrations/versions/0012_audit.py``). Functions take an open Session and
never commit: the caller's transaction holds one record, or one page of reads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, and_, insert, or_, select
from sqlalchemy.orm import Session

from peloton.errors import InvalidArgument
from peloton.storage.jobs import decode_token, encode_token
from peloton.storage.models import AuditRecordRow

_BAD_TOKEN = "is not a token returned by this server"


@dataclass(frozen=True)
class AuditRecord:
    """One mutating RPC: when it began, who called (``user`` "" is the anonymous caller), its
    full method name, what it was about (``target``: a job id, pool path or hostname), from
    where (``peer``), and how it ended (``code``, the status code's name, and its message).
    ``id`` is 0 until the record is stored."""

    at: datetime
    user: str
    groups: tuple[str, ...]
    via: str
    method: str
    target: str
    peer: str
    code: str
    message: str
    daemon: str = ""
    id: int = 0


@dataclass(frozen=True)
class AuditFilter:
    """Which records to read: each field left empty (None) does not filter. ``methods`` is any
    of these full method names; ``since`` is inclusive, ``until`` exclusive."""

    user: str = ""
    methods: frozenset[str] = frozenset()
    target: str = ""
    code: str = ""
    since: datetime | None = None
    until: datetime | None = None


def append(session: Session | Connection, *records: AuditRecord) -> None:
    """Add ``records`` to the trail (in one statement)."""
    if not records:
        return
    session.execute(
        insert(AuditRecordRow),
        [
            {
                "at": record.at,
                "user_name": record.user,
                "groups": json.dumps(sorted(record.groups)),
                "via": record.via,
                "method": record.method,
                "target": record.target,
                "peer": record.peer,
                "code": record.code,
                "message": record.message,
                "daemon": record.daemon,
            }
            for record in records
        ],
    )


def list_records(
    session: Session, flt: AuditFilter, page_size: int, page_token: str
) -> tuple[list[AuditRecord], str]:
    """Records newest first (by when the call began), keyset-paged on (at, id); the token is ""
    on the last page."""
    query = select(AuditRecordRow)
    if flt.user:
        query = query.where(AuditRecordRow.user_name == flt.user)
    if flt.methods:
        query = query.where(AuditRecordRow.method.in_(sorted(flt.methods)))
    if flt.target:
        query = query.where(AuditRecordRow.target == flt.target)
    if flt.code:
        query = query.where(AuditRecordRow.code == flt.code)
    if flt.since is not None:
        query = query.where(AuditRecordRow.at >= flt.since)
    if flt.until is not None:
        query = query.where(AuditRecordRow.at < flt.until)
    if page_token:
        at, last_id = _cursor(page_token)
        query = query.where(
            or_(
                AuditRecordRow.at < at,
                and_(AuditRecordRow.at == at, AuditRecordRow.id < last_id),
            )
        )
    order = (AuditRecordRow.at.desc(), AuditRecordRow.id.desc())
    rows = list(session.scalars(query.order_by(*order).limit(page_size + 1)))
    more = len(rows) > page_size
    rows = rows[:page_size]
    token = encode_token([rows[-1].at.isoformat(), rows[-1].id]) if more else ""
    return [_record(r) for r in rows], token


def _record(row: AuditRecordRow) -> AuditRecord:
    return AuditRecord(
        at=row.at,
        user=row.user_name,
        groups=tuple(json.loads(row.groups)),
        via=row.via,
        method=row.method,
        target=row.target,
        peer=row.peer,
        code=row.code,
        message=row.message,
        daemon=row.daemon,
        id=row.id,
    )


def _cursor(token: str) -> tuple[datetime, int]:
    values = decode_token(token)
    if len(values) != 2 or not isinstance(values[0], str) or type(values[1]) is not int:
        raise InvalidArgument("page_token", _BAD_TOKEN)
    try:
        at = datetime.fromisoformat(values[0])
    except ValueError as exc:
        raise InvalidArgument("page_token", _BAD_TOKEN) from exc
    if at.tzinfo is None:
        # Tokens carry UTC times; a naive one was not made here (and cannot be compared).
        raise InvalidArgument("page_token", _BAD_TOKEN)
    return at, values[1]
