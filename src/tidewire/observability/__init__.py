"""Observability: the metrics registry (``metrics``), the recent-samples ring behind the
dashboard's charts (``samples``), tracing helpers (``tracing``) and structured logs (``logs``).

Every layer reports through these modules; none of them is imported on the produce hot path
for per-message work (docs/observability.md).
"""
