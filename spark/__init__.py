"""Runnable Spark pipelines built on ackkit.spark (see docs/guide/spark.md)."""
