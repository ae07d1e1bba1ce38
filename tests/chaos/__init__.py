"""The chaos suite: ackkit consumers under fault injection, on a broker node of its own.

`python -m tests.chaos [--quick] [--json PATH]` (`make chaos`); the quick mode also
runs inside `make test` (tests/chaos/test_chaos_quick.py, marked chaos and integration).
See run.py for what is injected and how the figures are computed.
"""
