"""``tidewire cluster status | nodes``: a cluster as one of its nodes sees it (its METADATA
answer: the live nodes, the controller, each partition's leader, epoch, replicas and ISR),
and with ``status`` the cluster's key figures summed over the live nodes (CLUSTER_METRICS:
:mod:`tidewire.server.cluster_metrics`)."""

from __future__ import annotations

import asyncio
from typing import Annotated, TypeVar

import msgspec
import typer

from tidewire.client._transport import Transport, parse_addr
from tidewire.cluster.metrics import cluster_totals
from tidewire.errors import TidewireError
from tidewire.protocol.messages import (
    Body,
    ClusterMetricsRequest,
    ClusterMetricsResponse,
    MetadataRequest,
    MetadataResponse,
)
from tidewire.security.credentials import Credentials
from tidewire.security.tls import TlsOptions

from ._common import (
    DEFAULT_ADDR,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    JsonOption,
    cli_credentials,
    cli_tls,
    echo_json,
    fail,
)

__all__ = ["cluster_app"]

_A = TypeVar("_A")

cluster_app = typer.Typer(
    name="cluster",
    help="A cluster's nodes, controller and partition leaders (docs/cluster.md).",
    no_args_is_help=True,
)

ClusterAddrOption = Annotated[
    str,
    typer.Option(
        "--addr",
        envvar="TIDEWIRE_ADDR",
        help="Any node of the cluster, HOST:PORT; several comma-separated are tried in turn.",
        show_envvar=True,
    ),
]


async def _ask(
    addr: str,
    request: Body,
    answer: type[_A],
    timeout_s: float,
    creds: Credentials | None,
    tls: TlsOptions | None,
) -> _A:
    """``request``'s answer from the one node ``addr``, of type ``answer`` (a connection of
    its own, closed before returning)."""
    t = Transport(
        addr,
        connect_timeout_s=timeout_s,
        request_timeout_s=timeout_s,
        tls=tls,
        credentials=creds,
    )
    try:
        response = await t.request(request)
    finally:
        await t.close()
    assert response is not None
    body = response.body
    assert isinstance(body, answer)
    return body


def _metadata(addr: str, timeout_s: float) -> MetadataResponse:  # noqa: RET503 (fail exits)
    """The METADATA answer of the first of ``addr``'s nodes that gives one."""
    addrs = [a.strip() for a in addr.split(",") if a.strip()]
    for a in addrs:
        try:
            parse_addr(a)
        except ValueError as exc:
            fail(f"--addr: {exc}", EXIT_USAGE)
    creds, tls = cli_credentials(), cli_tls()

    errors = []
    for a in addrs:
        try:
            meta = asyncio.run(_ask(a, MetadataRequest(), MetadataResponse, timeout_s, creds, tls))
        except KeyboardInterrupt:
            raise typer.Exit(EXIT_INTERRUPTED) from None
        except TidewireError as exc:
            errors.append(f"{a}: {exc.message}")
            continue
        if not meta.nodes:
            fail(f"{a} is a single node (started without --cluster), not a cluster's")
        return meta
    fail("no node answered: " + "; ".join(errors))


def _figures(addr: str, timeout_s: float) -> tuple[ClusterMetricsResponse | None, str]:
    """The CLUSTER_METRICS answer of the first of ``addr``'s nodes that gives one, or None
    and why none did (a node that predates it, or a principal without describe on the
    cluster: ``status`` shows the rest all the same)."""
    creds, tls = cli_credentials(), cli_tls()

    errors = []
    for a in (a.strip() for a in addr.split(",") if a.strip()):
        try:
            got = asyncio.run(
                _ask(a, ClusterMetricsRequest(), ClusterMetricsResponse, timeout_s, creds, tls)
            )
        except KeyboardInterrupt:
            raise typer.Exit(EXIT_INTERRUPTED) from None
        except TidewireError as exc:
            errors.append(f"{a}: {exc.message}")
            continue
        if got.error_code:
            errors.append(f"{a}: {got.error_message}")
            continue
        return got, ""
    return None, "; ".join(errors)


def _rate(v: float | int | None) -> str:
    return "-" if v is None else f"{v:,.0f}"


TimeoutOption = Annotated[
    float, typer.Option("--timeout", min=0.001, help="Give up on a node after this long (s).")
]


@cluster_app.command("nodes")
def nodes(
    addr: ClusterAddrOption = DEFAULT_ADDR,
    timeout: TimeoutOption = 10.0,
    as_json: JsonOption = False,
) -> None:
    """The live nodes (those registered in etcd) and where they are reached; the controller
    is marked."""
    meta = _metadata(addr, timeout)
    if as_json:
        echo_json(
            {
                "controller": meta.controller,
                "nodes": [msgspec.to_builtins(n) for n in meta.nodes],
            }
        )
        return
    for n in meta.nodes:
        mark = "  controller" if n.node_id == meta.controller else ""
        typer.echo(f"{n.node_id}  {n.host}:{n.port}{mark}")


@cluster_app.command("status")
def status(
    addr: ClusterAddrOption = DEFAULT_ADDR,
    timeout: TimeoutOption = 10.0,
    as_json: JsonOption = False,
) -> None:
    """The controller, the live nodes, and every partition with its leader, leader epoch,
    replicas and in-sync replicas; counts of under-replicated partitions (fewer in sync than
    replicas) and offline ones (no leader); and the cluster's figures summed over the live
    nodes (messages and bytes in and out, rates, partitions led, ISR shrinks, stale leases),
    naming the nodes that did not answer within 5 s."""
    meta = _metadata(addr, timeout)
    figures, why = _figures(addr, timeout)
    summed = cluster_totals(figures.nodes) if figures is not None else None
    parts = [(t.name, p) for t in meta.topics for p in t.partitions]
    under = sum(1 for _, p in parts if len(p.isr) < len(p.replicas))
    offline = sum(1 for _, p in parts if p.leader == -1)
    if as_json:
        echo_json(
            {
                "controller": meta.controller,
                "nodes": [msgspec.to_builtins(n) for n in meta.nodes],
                "partitions": [
                    {
                        "topic": name,
                        "partition": p.partition,
                        "leader": p.leader,
                        "leader_epoch": p.leader_epoch,
                        "replicas": p.replicas,
                        "isr": p.isr,
                    }
                    for name, p in parts
                ],
                "under_replicated": under,
                "offline": offline,
                "metrics": None
                if figures is None
                else {
                    "totals": summed,
                    "nodes": [msgspec.to_builtins(n) for n in figures.nodes],
                    "missing_nodes": figures.missing_nodes,
                },
            }
        )
        if figures is None:
            typer.echo(f"cluster figures not shown: {why}", err=True)
        return
    controller = meta.controller if meta.controller != -1 else "none"
    typer.echo(
        f"nodes: {len(meta.nodes)}, controller: {controller}, partitions: {len(parts)}, "
        f"under-replicated: {under}, offline: {offline}"
    )
    for n in meta.nodes:
        typer.echo(f"  node {n.node_id}  {n.host}:{n.port}")
    if figures is not None and summed is not None:
        answered = len(figures.nodes)
        typer.echo(
            f"totals over {answered} node{'s' if answered != 1 else ''}: "
            f"messages in {summed['messages_in']:,} ({_rate(summed['messages_in_per_s'])}/s), "
            f"out {summed['messages_out']:,}; bytes in {summed['bytes_in']:,} "
            f"({_rate(summed['bytes_in_per_s'])}/s), out {summed['bytes_out']:,}; "
            f"ISR shrinks {summed['isr_shrinks']:,}, expands {summed['isr_expands']:,}; "
            f"stale leases now {summed['nodes_lease_stale']}"
        )
        if figures.missing_nodes:
            nodes = ", ".join(map(str, figures.missing_nodes))
            typer.echo(f"  nodes that did not answer (not in the totals): {nodes}")
    else:
        typer.echo(f"cluster figures not shown: {why}", err=True)
    if parts:
        typer.echo(f"{'TOPIC':<24} {'PART':>4} {'LEADER':>6} {'EPOCH':>5}  REPLICAS  ISR")
    for name, p in parts:
        leader = "-" if p.leader == -1 else str(p.leader)
        typer.echo(
            f"{name:<24} {p.partition:>4} {leader:>6} {p.leader_epoch:>5}  "
            f"{','.join(map(str, p.replicas))}  {','.join(map(str, p.isr))}"
        )
