"""Makes chosen Python workers of Spark start slowly (imported at interpreter start-up by
every Python process whose PYTHONPATH holds this directory).

ACKKIT_TEST_SLOW_WORKER="<module>:<seconds>:<count file>:<times>": a process started with
`-m <module>` sleeps <seconds> before anything else, the first <times> times (counted in
<count file>, one line per slow start): Spark's wait for the worker to connect back runs
out as on a machine too busy to start Python in time."""

import os
import sys
import time

_spec = os.environ.get("ACKKIT_TEST_SLOW_WORKER", "")
if _spec:
    _module, _seconds, _count, _times = _spec.rsplit(":", 3)
    if _module in getattr(sys, "orig_argv", ()):
        with open(_count, "a+") as _f:
            _f.seek(0)
            _done = len(_f.read().splitlines())
            if _done < int(_times):
                _f.write(f"{os.getpid()}\n")
        if _done < int(_times):
            time.sleep(float(_seconds))
