"""``peloton audit``: the audit trail of mutating calls, newest first."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import click
import grpc

from peloton.cli import output as out
from peloton.cli.common import connect
from peloton.v1 import audit_pb2

# Records asked for in one page at most (the server's most).
PAGE_RECORDS = 1000
# A time relative to now: a number and a unit (30m, 2h, 7d), that long ago.
_AGO = re.compile(r"(\d+)([smhd])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
CODES = list(grpc.StatusCode.__members__)


class TimeParam(click.ParamType[datetime, Any]):
    """A point in time: ISO 8601 (``2026-11-27T10:00``, ``2026-11-27``; UTC unless it names its
    offset) or that long ago (``30m``, ``2h``, ``7d``)."""

    name = "TIME"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> datetime:
        if isinstance(value, datetime):
            return value
        text = str(value).strip()
        ago = _AGO.fullmatch(text)
        if ago is not None:
            amount, unit = ago.groups()
            return datetime.now(UTC) - timedelta(**{_UNITS[unit]: int(amount)})
        try:
            when = datetime.fromisoformat(text)
        except ValueError:
            self.fail(
                f"{text!r} is not a time: ISO 8601 (2026-11-27T10:00, UTC unless it has an "
                "offset) or an age (30m, 2h, 7d)",
                param,
                ctx,
            )
        return when.replace(tzinfo=UTC) if when.tzinfo is None else when


@click.command()
@click.option("--user", "-u", default="", help="Only calls of this user.")
@click.option(
    "--method",
    "-m",
    default="",
    help="Only calls of this RPC: its name (KillJob, any case) or full method name.",
)
@click.option(
    "--target", "-t", default="", help="Only calls about this job id, pool path or hostname."
)
@click.option(
    "--result",
    "-r",
    "code",
    type=out.StateChoice(CODES),
    metavar="CODE",
    help="Only calls that ended with this status code (OK, PERMISSION_DENIED, ...; any case).",
)
@click.option("--since", type=TimeParam(), help="Only calls from TIME on (ISO 8601, or 2h: ago).")
@click.option("--until", type=TimeParam(), help="Only calls before TIME (ISO 8601, or 2h: ago).")
@click.option(
    "--limit",
    default=100,
    show_default=True,
    type=click.IntRange(1),
    help="Records to show at most, newest first.",
)
@out.list_output_option
@click.pass_context
def audit(
    ctx: click.Context,
    user: str,
    method: str,
    target: str,
    code: str | None,
    since: datetime | None,
    until: datetime | None,
    limit: int,
    fmt: str,
) -> None:
    """The audit trail: every call that changes something (submit, kill, restart, delete,
    pool and host changes), refused and failed ones included, newest first.

    \b
    Examples:
      peloton audit --since 2h
      peloton audit --user alice --result PERMISSION_DENIED -o json
      peloton audit --target /research/vision --method CreateJob
    """
    records: list[audit_pb2.AuditRecord] = []
    token = ""
    with connect(ctx) as client:
        while len(records) < limit:
            page = client.list_audit_records(
                user=user,
                method=method,
                target=target,
                code=(code or "").upper(),
                since=since,
                until=until,
                page_size=min(PAGE_RECORDS, limit - len(records)),
                page_token=token,
            )
            records.extend(page.records)
            token = page.next_page_token
            if not token:
                break
    if fmt in ("table", "wide"):
        print_records(records, wide=fmt == "wide")
        if token:
            click.echo(f"(more records: raise --limit, now {limit})", err=True)
    else:
        data = {"records": [out.to_dict(r) for r in records], "next_page_token": token}
        out.emit_data(data, fmt)


def print_records(records: list[audit_pb2.AuditRecord], wide: bool = False) -> None:
    rows = [
        (
            out.when(r.time),
            r.user or "anonymous",
            r.method.rsplit("/", 1)[-1],
            r.target or "-",
            r.code,
            r.peer,
            out.reason("", r.message, wide),
        )
        for r in records
    ]
    columns = ("TIME", "USER", "METHOD", "TARGET", "RESULT", "FROM", "MESSAGE")
    out.console(wide).print(out.table(columns, rows))
