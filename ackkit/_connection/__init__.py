"""Talking to a broker, whatever the client library: what both runtimes share about it.

Here: AMQP URLs and masking their passwords (`url`), a cluster's node addresses and the
order they are tried in (`addresses`), TLS for amqps:// (`tls`),
connect errors and the reconnect backoff (`io`), the seam where a `memory://` URL
opens the test kit's in-memory broker instead (`inmemory`), and salvaging a
content header a client library could not read (`salvage`).

Not here: a client library's own connection and channel code (`ackkit._sync`,
`ackkit._async`), decisions (`ackkit._core`), an app's settings (`ackkit._app`).
"""
