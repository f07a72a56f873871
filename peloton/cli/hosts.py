"""``peloton host ...``: the Mesos agents peloton knows, and draining them."""

from __future__ import annotations

from collections.abc import Sequence

import click

from peloton.cli import output as out
from peloton.cli.common import connect
from peloton.v1 import common_pb2, host_pb2

STATES = ("UP", "DRAINING", "DOWN")


def _res(r: common_pb2.Resources) -> str:
    return f"{r.cpu:g} cpu, {r.mem_mb:g} MB, {r.disk_mb:g} MB disk, {r.gpu:g} gpu"


def _attrs(h: host_pb2.Host) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(h.attributes.items())) or "-"


def _print_hosts(hosts: Sequence[host_pb2.Host]) -> None:
    rows = [
        (
            h.hostname,
            h.agent_id,
            h.state,
            f"{h.free.gpu:g}/{h.total.gpu:g}",
            f"{h.free.cpu:g}/{h.total.cpu:g}",
            f"{h.free.mem_mb:g}/{h.total.mem_mb:g}",
            _attrs(h),
        )
        for h in hosts
    ]
    columns = (
        "HOST",
        "AGENT",
        "STATE",
        "GPU FREE/TOTAL",
        "CPU FREE/TOTAL",
        "MEM_MB FREE/TOTAL",
        "ATTRS",
    )
    out.console().print(out.table(columns, rows))


def _show(h: host_pb2.Host, fmt: str) -> None:
    if fmt != "table":
        out.emit_data(out.to_dict(h), fmt)
        return
    click.echo(f"Host:       {h.hostname}")
    click.echo(f"State:      {h.state}")
    click.echo(f"Agent:      {h.agent_id} at {h.address}")
    click.echo(f"Total:      {_res(h.total)}")
    click.echo(f"Used:       {_res(h.used)}")
    click.echo(f"Free:       {_res(h.free)}")
    click.echo(f"Attributes: {_attrs(h)}")


@click.group()
def host() -> None:
    """Hosts (Mesos agents): resources, attributes, draining."""


@host.command(name="list")
@click.option(
    "--state",
    "states",
    multiple=True,
    type=out.StateChoice(STATES),
    metavar="STATE",
    help=f"Only hosts in this state (repeatable; any case): {', '.join(STATES)}.",
)
@out.output_option
@click.pass_context
def host_list(ctx: click.Context, states: tuple[str, ...], fmt: str) -> None:
    """List the known hosts with free/total resources."""
    with connect(ctx) as client:
        hosts = client.list_hosts([s.upper() for s in states])
    if fmt == "table":
        _print_hosts(hosts)
    else:
        out.emit_data([out.to_dict(h) for h in hosts], fmt)


@host.command(name="get")
@click.argument("host_name", metavar="HOST")
@out.output_option
@click.pass_context
def host_get(ctx: click.Context, host_name: str, fmt: str) -> None:
    """Show one host.

    HOST is a hostname or an agent id (the agent id where agents share a hostname).
    """
    with connect(ctx) as client:
        _show(client.get_host(host_name), fmt)


@host.command()
@click.argument("host_name", metavar="HOST")
@out.output_option
@click.pass_context
def drain(ctx: click.Context, host_name: str, fmt: str) -> None:
    """Give HOST no new placements (its running tasks keep running).

    HOST is a hostname or an agent id (the agent id where agents share a hostname).
    """
    with connect(ctx) as client:
        h = client.drain_host(host_name)
    click.echo(f"host {host_name} is {h.state}") if fmt == "table" else _show(h, fmt)


@host.command()
@click.argument("host_name", metavar="HOST")
@out.output_option
@click.pass_context
def undrain(ctx: click.Context, host_name: str, fmt: str) -> None:
    """Let HOST take placements again.

    HOST is a hostname or an agent id (the agent id where agents share a hostname).
    """
    with connect(ctx) as client:
        h = client.undrain_host(host_name)
    click.echo(f"host {host_name} is {h.state}") if fmt == "table" else _show(h, fmt)
