"""Optional parts of tidewire and what to install for them.

Spark support (:mod:`tidewire.spark`, ``format("tidewire")``, ``tidewire export``) needs
pyspark and pyarrow, about 660 MB that a broker, the clients and the other commands never
use; they come with the extra ``tidewire[spark]``. :func:`require_spark` turns their absence
into one message that says what to install, instead of an ImportError from deep inside.
"""

from __future__ import annotations

import importlib

__all__ = ["SPARK_HINT", "SPARK_MODULES", "SparkMissingError", "require_spark"]

#: What to install for Spark support.
SPARK_HINT = "Spark support needs: pip install 'tidewire[spark]'"
#: The modules Spark support imports that tidewire's own dependencies do not bring.
SPARK_MODULES = ("pyspark", "pyarrow")


class SparkMissingError(ImportError):
    """pyspark or pyarrow is not installed; the message says which and what to install."""


def require_spark() -> None:
    """Import pyspark and pyarrow, or say what to install.

    Raises:
        SparkMissingError: one of them is not installed (its ``name`` is the first missing
            module); the error it got is its ``__cause__``.
    """
    missing: list[str] = []
    cause: ImportError | None = None
    for module in SPARK_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            # Only the module itself missing; a broken install's inner error propagates.
            if (
                exc.name is not None
                and exc.name != module
                and not exc.name.startswith(module + ".")
            ):
                raise
            missing.append(module)
            cause = cause or exc
    if missing:
        raise SparkMissingError(
            f"{SPARK_HINT} (not installed: {', '.join(missing)})", name=missing[0]
        ) from cause
