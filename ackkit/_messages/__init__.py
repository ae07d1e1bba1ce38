"""Messages as the application sees them, in and out, for every front that has them.

Here: one delivery as a handler (or pull mode, the inbox, Spark's rows) sees it
and how it is settled (`delivery`), and what a publish sends and what its outcome
means, for every way ackkit publishes (`publish`).

Not here: deciding a settle, a retry or a dead letter (`ackkit._core`), putting
frames on a channel (`ackkit._sync`, `ackkit._async`), the bytes of a copy's
properties and headers (`ackkit._core.wire`).
"""
