"""The interpreter: what every runtime repeats, written once, client-neutral.

The core (`ackkit._core`) decides; a runtime (`ackkit._sync` on pika, `ackkit._async`
on aio-pika) owns a client's channels, threads or tasks. Between them, this room holds
what both would otherwise write twice: how a step the core decided is carried out over
a small channel protocol, the attempt loop around a handler call (a sans-I/O generator
that a thread driver and an asyncio driver run), and the map from a channel's delivery
tags to the runtime's own objects. Nothing here imports a client library or a runtime.
"""
