"""Throughput benchmarks: ``make bench`` / ``make bench-quick``.

Raw pika / aio-pika anchors, peers (FastStream, kombu) with their defaults, and the
ackkit runtimes, each drained from a pre-filled queue in a fresh process. Cases and
their protocol: :mod:`tests.benchmarks.cases`; the runner: :mod:`tests.benchmarks.harness`.
"""
