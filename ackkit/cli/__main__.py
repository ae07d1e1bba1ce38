"""`python -m ackkit.cli`: the `ackkit` command (how `ackkit run --workers` starts each worker)."""

from . import main

main()
