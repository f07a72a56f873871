"""``peloton pool ...``: create, update, delete and inspect resource pools."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import click

from peloton.cli import output as out
from peloton.cli.common import cli_error, connect, read_text_file
from peloton.core.access import parse_grant
from peloton.core.resources import KINDS
from peloton.core.spec import check_pool_path, load_pool_spec_yaml
from peloton.errors import InvalidArgument
from peloton.v1 import pool_pb2


def _read(file: Path, grants: tuple[str, ...]) -> pool_pb2.PoolSpec:
    """The pool spec of FILE, with the ``--grant`` options' grants after the file's."""
    text = read_text_file(file)
    try:
        spec = load_pool_spec_yaml(text)
        for i, item in enumerate(grants):
            grant = parse_grant(item, f"--grant[{i}]")
            spec.grants.append(
                pool_pb2.Grant(
                    permission=pool_pb2.Permission.Value(f"PERMISSION_{grant.permission.name}"),
                    **{grant.principal.kind: grant.principal.name},
                )
            )
    except Exception as exc:
        raise cli_error(exc) from None
    return spec


def _grant_option(f: Any) -> Any:
    return click.option(
        "--grant",
        "grants",
        multiple=True,
        metavar="PERMISSION=user:NAME|group:NAME",
        help="Give view, submit or admin on the pool (and below) to a user or a group "
        "(repeatable; added to the file's grants).",
    )(f)


def grant_text(grant: pool_pb2.Grant) -> str:
    """``submit=user:alice``: a grant as ``--grant`` takes it."""
    permission = pool_pb2.Permission.Name(grant.permission).removeprefix("PERMISSION_").lower()
    who = f"user:{grant.user}" if grant.user else f"group:{grant.group}"
    return f"{permission}={who}"


def _check_path(path: str) -> None:
    try:
        check_pool_path(path, "PATH")
    except InvalidArgument as exc:
        raise click.BadParameter(exc.reason, param_hint="PATH") from None


@click.group()
def pool() -> None:
    """Resource pools: a tree of reservations, limits and shares.

    \b
    A pool file (YAML):
      path: /research/vision
      owner: vision-team
      resources:
        gpu: {reservation: 8, limit: 32, share: 2}
        cpu: {reservation: 64, limit: 256, share: 1}
      grants:
        - submit=group:vision
        - {user: alice, permission: admin}
    """


def _file_argument(f: Any) -> Any:
    return click.argument("file", type=click.Path(dir_okay=False, path_type=Path, allow_dash=True))(
        f
    )


@pool.command()
@_file_argument
@_grant_option
@out.output_option
@click.pass_context
def create(ctx: click.Context, file: Path, grants: tuple[str, ...], fmt: str) -> None:
    """Create the pool described in FILE (YAML; - reads standard input)."""
    spec = _read(file, grants)
    with connect(ctx) as client:
        created = client.create_pool(spec)
    _show_one(created, fmt, f"pool {created.spec.path} created")


@pool.command()
@_file_argument
@_grant_option
@out.output_option
@click.pass_context
def update(ctx: click.Context, file: Path, grants: tuple[str, ...], fmt: str) -> None:
    """Replace a pool's settings with those in FILE (kinds left out: back to defaults; grants
    left out: removed)."""
    spec = _read(file, grants)
    with connect(ctx) as client:
        updated = client.update_pool(spec)
    _show_one(updated, fmt, f"pool {updated.spec.path} updated")


@pool.command()
@click.argument("path")
@click.pass_context
def delete(ctx: click.Context, path: str) -> None:
    """Delete the pool at PATH (it must have no child pools and no unfinished jobs)."""
    _check_path(path)
    with connect(ctx) as client:
        client.delete_pool(path)
    click.echo(f"pool {path} deleted")


@pool.command()
@click.argument("path")
@out.output_option
@click.pass_context
def get(ctx: click.Context, path: str, fmt: str) -> None:
    """Show one pool: its settings and, per kind, entitlement, allocation and demand."""
    _check_path(path)
    with connect(ctx) as client:
        found = client.get_pool(path)
    if fmt != "table":
        out.emit_data(out.to_dict(found), fmt)
        return
    spec = found.spec
    click.echo(f"Pool:     {spec.path}")
    if spec.path != "/":
        click.echo(f"Owner:    {spec.owner or '-'}")
        waiting = f"{found.queued_gangs} gangs waiting"
        if found.oversized_gangs:
            waiting += f", {found.oversized_gangs} bigger than the entitlement"
        click.echo(f"Queue:    {_queue_policy(spec)} ({waiting})")
        click.echo(f"Grants:   {', '.join(grant_text(g) for g in spec.grants) or '-'}")
    click.echo(f"Children: {', '.join(found.children) or '-'}")
    rows = []
    for kind in KINDS:
        s = found.status[kind]
        policy = ""
        if kind in spec.resources:
            policy = pool_pb2.ResourcePolicy.Name(spec.resources[kind].policy)
            policy = policy.removeprefix("RESOURCE_POLICY_")
        rows.append(
            (
                kind,
                _n(s.reservation),
                _limit(s),
                _n(s.share),
                _n(s.entitlement),
                _n(s.allocation),
                _n(s.demand),
                _n(s.borrowed),
                _n(s.lent),
                policy or "ELASTIC",
            )
        )
    columns = (
        "KIND",
        "RESERVATION",
        "LIMIT",
        "SHARE",
        "ENTITLEMENT",
        "ALLOCATION",
        "DEMAND",
        "BORROWED",
        "LENT",
        "POLICY",
    )
    out.console().print(out.table(columns, rows))


@pool.command(name="list")
@click.option(
    "--kind",
    "kinds",
    multiple=True,
    type=click.Choice(KINDS),
    help="Only these kinds' columns (repeatable); default: every kind in use or configured.",
)
@out.output_option
@click.pass_context
def pool_list(ctx: click.Context, kinds: tuple[str, ...], fmt: str) -> None:
    """List every pool, parents first, with allocation / entitlement / limit per kind.

    \b
    QUEUED is the gangs waiting in a leaf pool; QUEUE its policy (PRIORITY_FIFO or FIFO).
    json and yaml carry every field of every pool, zero values included.
    """
    with connect(ctx) as client:
        pools = client.list_pools()
    if fmt != "table":
        out.emit_data({"pools": [out.to_dict(p) for p in pools]}, fmt)
        return
    shown = list(kinds) or _kinds_in_use(pools)
    rows = []
    for p in pools:
        root = p.spec.path == "/"
        rows.append(
            (
                p.spec.path,
                "-" if root else p.spec.owner or "-",
                "-" if root else _queue_policy(p.spec),
                "-" if p.children else str(p.queued_gangs),
                *(
                    f"{_n(s.allocation)}/{_n(s.entitlement)}/{_limit(s)}"
                    for s in (p.status[k] for k in shown)
                ),
                ",".join(_leaf_name(c) for c in p.children) or "-",
            )
        )
    columns = (
        "POOL",
        "OWNER",
        "QUEUE",
        "QUEUED",
        *(f"{k.upper()} ALLOC/ENT/LIMIT" for k in shown),
        "CHILDREN",
    )
    out.console().print(out.table(columns, rows))


@pool.command()
@click.option(
    "--kind",
    "kinds",
    multiple=True,
    type=click.Choice(KINDS),
    help="Only these kinds (repeatable); default: every kind in use or configured.",
)
@out.output_option
@click.pass_context
def tree(ctx: click.Context, kinds: tuple[str, ...], fmt: str) -> None:
    """The pool tree with, per kind, reservation / entitlement / allocation / limit.

    ALLOC above RES means the pool borrows (▲), below means it lends what it does not use (▽).
    """
    with connect(ctx) as client:
        pools = client.list_pools()
    if fmt != "table":
        out.emit_data([out.to_dict(p) for p in pools], fmt)
        return
    shown = list(kinds) or _kinds_in_use(pools)
    rows = []
    for p, prefix in zip(pools, _tree_prefixes(pools), strict=True):
        for i, kind in enumerate(shown):
            s = p.status[kind]
            rows.append(
                (
                    f"{prefix}{_leaf_name(p.spec.path)}" if i == 0 else "",
                    kind,
                    _n(s.reservation),
                    _n(s.entitlement),
                    _n(s.allocation),
                    _limit(s),
                    str(p.queued_gangs) if i == 0 and not p.children else "",
                    _sharing(s) if p.spec.path != "/" else "capacity",
                )
            )
    columns = ("POOL", "KIND", "RES", "ENT", "ALLOC", "LIMIT", "QUEUED", "SHARING")
    out.console().print(out.table(columns, rows))


def _show_one(p: pool_pb2.Pool, fmt: str, line: str) -> None:
    if fmt == "table":
        click.echo(line)
    else:
        out.emit_data(out.to_dict(p), fmt)


def _queue_policy(spec: pool_pb2.PoolSpec) -> str:
    return pool_pb2.QueuePolicy.Name(spec.queue_policy).removeprefix("QUEUE_POLICY_")


def _kinds_in_use(pools: list[pool_pb2.Pool]) -> list[str]:
    used = [
        k
        for k in KINDS
        if any(
            p.status[k].reservation or p.status[k].allocation or p.status[k].HasField("limit")
            for p in pools
            if p.spec.path != "/"
        )
    ]
    return used or ["gpu", "cpu"]


def _tree_prefixes(pools: list[pool_pb2.Pool]) -> list[str]:
    """Box-drawing prefixes for pools listed parents first, depth first, children sorted."""
    last_child = {p.children[-1] for p in pools if p.children}
    prefixes = []
    for p in pools:
        path = p.spec.path
        if path == "/":
            prefixes.append("")
            continue
        parts = path.strip("/").split("/")
        ancestors = ["/" + "/".join(parts[:i]) for i in range(1, len(parts))]
        stem = "".join("   " if a in last_child else "│  " for a in ancestors)
        prefixes.append(stem + ("└─ " if path in last_child else "├─ "))
    return prefixes


def _leaf_name(path: str) -> str:
    return "/" if path == "/" else path.rsplit("/", 1)[-1]


def _sharing(s: pool_pb2.ResourceStatus) -> str:
    if s.borrowed > 0:
        return f"▲ borrows {_n(s.borrowed)}"
    if s.lent > 0 and s.allocation < s.reservation:
        return f"▽ lends {_n(s.lent)}"
    return ""


def _limit(s: pool_pb2.ResourceStatus) -> str:
    return _n(s.limit) if s.HasField("limit") else "∞"


def _n(value: float) -> str:
    if math.isinf(value):
        return "∞"
    return f"{value:.4g}" if value != int(value) else f"{int(value)}"
