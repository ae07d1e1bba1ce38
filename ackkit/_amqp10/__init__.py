"""The App's runtime over AMQP 1.0 (RabbitMQ 4.x), on python-qpid-proton.

The App's runtime (`ackkit._sync`) drives a pika `SelectConnection`: channels, frames,
callbacks on one I/O thread. Over AMQP 1.0 the same runtime drives the stand-ins in
this room instead, so every decision stays the core's and every loop the interpreter's:

- `loop`: the I/O loop, a proton `Container` on the runtime's I/O thread (callbacks
  from other threads come in through an `EventInjector`, timers are its tasks);
- `connection`: the connection, opened with `reconnect=False` (the runtime reconnects,
  with its own backoff and node rotation);
- `channel`: a channel is a session; a consumer is a receiver link whose credit is
  the prefetch, granted as deliveries are settled; a settle is the outcome the core's
  rule gives (`ackkit._core.settlement`); publishing is an unsettled send on an
  anonymous sender link, whose outcome is the broker's confirm;
- `fallback`: after the broker ended a connection on a message it could not convert
  (`ackkit._core.conversion`), a consumer first takes its queue's head over AMQP 0-9-1;
- `messages`: an AMQP 1.0 message as the properties and body the runtime and the
  handlers know from AMQP 0-9-1, and back, mapped as RabbitMQ maps them.

Chosen with `App(url, protocol="amqp1.0")`. Topology is declared as for AMQP 0-9-1
(a short AMQP 0-9-1 connection to the same node, which RabbitMQ 4.x always serves);
that connection also reports the broker's version, and anything older than 4.0 is
refused there with an error naming it (`ackkit._core.brokers.amqp10_traits`).
"""
