"""Spark end to end into parquet (placeholder until examples/spark_to_parquet.py exists)."""

from __future__ import annotations

from typing import Any

from bench_common import REPO, Context, NotYet

__all__ = ["spark_parquet"]

EXAMPLE = REPO / "examples" / "spark_to_parquet.py"


def spark_parquet(ctx: Context) -> dict[str, Any]:
    if not EXAMPLE.exists():
        raise NotYet(f"{EXAMPLE.relative_to(REPO)} does not exist yet")
    raise NotYet("spark part not wired yet")
