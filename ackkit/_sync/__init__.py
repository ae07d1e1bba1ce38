"""The sync runtime on pika: carries out the core's decisions on real channels."""
