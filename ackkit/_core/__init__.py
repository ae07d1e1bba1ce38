"""The sans-I/O core of ackkit.

Nothing in this package does I/O or imports a client library (pika,
aio_pika, pyspark). It turns events (a delivery arrived, a handler finished,
a publish was confirmed, the channel closed, time passed) into decisions,
returned as small frozen action values that a runtime carries out.
"""
