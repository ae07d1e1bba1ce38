"""python -m tests.chaos [--quick] [--json PATH] [--messages N]: the chaos run, table and JSON."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .run import Settings, run, table


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="~6,000 messages and fewer faults")
    ap.add_argument("--json", type=Path, help="write the figures as JSON here")
    ap.add_argument("--messages", type=int, help="override the number of messages")
    ap.add_argument("--seed", type=int, help="random seed (message mix and fault plan)")
    ap.add_argument("--workdir", type=Path, help="keep records and logs here")
    ap.add_argument(
        "--runtimes",
        default="sync,async",
        help="the consumers' runtimes in turn: sync, async, amqp10 (comma separated)",
    )
    args = ap.parse_args(argv)
    s = Settings.quick() if args.quick else Settings()
    if args.messages:
        s.messages = args.messages
    if args.seed is not None:
        s.seed = args.seed
    s.runtimes = tuple(r.strip() for r in args.runtimes.split(",") if r.strip())
    result = run(s, args.workdir)
    print(table(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        out = dict(result.figures) if not result.skipped else {"skipped": result.skipped}
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    if result.skipped:
        return 0
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
