"""The Spark sources' own sans-I/O decisions: which deliveries a batch admits
(`admission`), what a batch holds and what it may ack once committed (`batches`) and
the stream source's offset ranges (`stream_offsets`). Its AMQP 1.0 record reader is
`ackkit._core.amqp10` (the AMQP 1.0 runtime salvages with it too).

Like `ackkit._core` (the consumer library's core, which these build on), nothing here
does I/O or imports a client library; only the Spark sources use it.
"""
