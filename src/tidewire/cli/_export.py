"""``tidewire export``: copy a topic into partitioned Parquet with Spark, exactly once."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Annotated

import typer

from tidewire._extras import SparkMissingError, require_spark
from tidewire.client import Credentials, TlsOptions

from ._common import (
    DEFAULT_ADDR,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    AddrOption,
    JsonOption,
    check_addr,
    cli_credentials,
    cli_tls,
    echo_json,
    fail,
)

__all__ = ["export"]


def export(
    topic: Annotated[str, typer.Argument(help="The topic to copy.")],
    to: Annotated[
        str, typer.Option("--to", help="The output directory (a path, or a Hadoop URL).")
    ],
    fmt: Annotated[str, typer.Option("--format", help="parquet, json, orc or csv.")] = "parquet",
    checkpoint: Annotated[
        str | None,
        typer.Option(
            "--checkpoint",
            help="The query's checkpoint directory (default: TO/_checkpoint). Keep it to "
            "resume where the last run stopped.",
        ),
    ] = None,
    once: Annotated[
        bool,
        typer.Option("--once", help="Copy what the topic holds now, then stop."),
    ] = False,
    partition_by: Annotated[
        str,
        typer.Option(
            "--partition-by",
            help="Directory levels: partition, date, date,partition or none.",
        ),
    ] = "partition",
    interval: Annotated[
        str,
        typer.Option("--interval", help="Without --once: a micro-batch this often."),
    ] = "10 seconds",
    starting_offsets: Annotated[
        str,
        typer.Option(
            "--starting-offsets",
            help="earliest or latest: where a first run (no checkpoint yet) starts.",
        ),
    ] = "earliest",
    max_offsets_per_trigger: Annotated[
        int | None,
        typer.Option("--max-offsets-per-trigger", min=1, help="The most records per batch."),
    ] = None,
    master: Annotated[
        str,
        typer.Option("--master", help="The Spark master (a cluster's URL; default: local)."),
    ] = "local[2]",
    addr: AddrOption = DEFAULT_ADDR,
    as_json: JsonOption = False,
) -> None:
    """Copy TOPIC into files partitioned by topic partition (or date) with Spark, exactly once.

    Runs until Ctrl-C (--once: copies what TOPIC holds now, then stops); a line per batch.

    Run again with the same --checkpoint to resume where it stopped; nothing is copied twice.

    Needs Spark support: pip install 'tidewire[spark]'.
    """
    check_addr(addr)
    # Spark is imported only by this command: the others start without it, and without the
    # extra tidewire[spark] installed.
    try:
        require_spark()
    except SparkMissingError as exc:
        fail(str(exc), EXIT_ERROR)
    from tidewire.spark._export import FORMATS, PARTITION_BY, ExportSpec  # noqa: PLC0415

    if fmt not in FORMATS:
        fail(f"--format {fmt!r}: must be one of {', '.join(FORMATS)}", EXIT_USAGE)
    if partition_by not in PARTITION_BY:
        fail(
            f"--partition-by {partition_by!r}: must be one of {', '.join(PARTITION_BY)}", EXIT_USAGE
        )
    if starting_offsets not in ("earliest", "latest"):
        fail("--starting-offsets must be earliest or latest", EXIT_USAGE)
    spec = ExportSpec(
        servers=addr,
        topic=topic,
        to=to,
        checkpoint=checkpoint or os.path.join(to, "_checkpoint"),
        fmt=fmt,
        partition_by=partition_by,
        once=once,
        interval=interval,
        starting_offsets=starting_offsets,
        max_offsets_per_trigger=max_offsets_per_trigger,
        extra_options={
            **spark_tls_options(cli_tls()),
            **spark_credential_options(cli_credentials()),
        },
    )
    _run(spec, master, as_json)


def spark_credential_options(creds: Credentials | None) -> dict[str, str]:
    """The Spark source's options (docs/spark.md) for the command's ``--api-key`` and
    ``--sasl-mechanism``."""
    if creds is None:
        return {}
    return {"tidewire.api.key": creds.api_key, "tidewire.sasl.mechanism": creds.mechanism}


def spark_tls_options(tls: TlsOptions | None) -> dict[str, str]:
    """The Spark source's options (docs/spark.md) for the command's TLS options."""
    if tls is None:
        return {}
    options = {"tidewire.tls": "true"}
    for name, value in (
        ("tidewire.tls.ca", tls.ca_file),
        ("tidewire.tls.cert", tls.cert_file),
        ("tidewire.tls.key", tls.key_file),
        ("tidewire.tls.server.name", tls.server_hostname),
    ):
        if value:
            options[name] = value
    return options


def _run(spec: object, master: str, as_json: bool) -> None:
    from pyspark.errors import PySparkException  # noqa: PLC0415 (see export)

    from tidewire.spark._export import (  # noqa: PLC0415
        BatchProgress,
        ExportSpec,
        new_session,
        run_export,
    )

    assert isinstance(spec, ExportSpec)
    if "://" not in spec.to:
        Path(spec.to).mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    totals = {"batches": 0, "rows": 0}

    def report(b: BatchProgress) -> None:
        totals["batches"] += 1
        totals["rows"] += b.rows
        if as_json:
            echo_json(b.to_json())
        else:
            typer.echo(b.line())

    from pyspark.sql import SparkSession  # noqa: PLC0415 (see export)

    ours = SparkSession.getActiveSession() is None  # embedded in a Spark program: not ours
    spark = new_session(master, f"tidewire export {spec.topic}")
    try:
        run_export(spark, spec, report, stop)
    except KeyboardInterrupt:
        stop.set()
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except PySparkException as exc:
        fail(str(exc).splitlines()[0], EXIT_ERROR)
    finally:
        if ours:
            spark.stop()
    if as_json:
        echo_json({"done": True, **totals, "to": spec.to})
    else:
        typer.echo(
            f"exported {totals['rows']:,} rows in {totals['batches']:,} batches to {spec.to}"
        )
