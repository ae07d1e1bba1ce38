"""Runnable Spark pipelines built on ackkit.spark (see spark/README.md)."""
