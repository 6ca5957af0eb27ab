"""Stand-in for verl's driver in ``test_step_metrics.py``: prints lines that verl's own console
logger and Ray's log forwarding wrote in the test, then exits with the code asked for.

Only this: the run command executes ``python -m <module> <overrides>`` and reads its stdout, and
a real verl run needs Ray, vLLM and minutes. The lines themselves come from verl's and Ray's code.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

LINES = "VC_STANDIN_LINES"
EXIT = "VC_STANDIN_EXIT"


def main() -> int:
    sys.stdout.write(Path(os.environ[LINES]).read_text())
    return int(os.environ.get(EXIT, "0"))


if __name__ == "__main__":
    raise SystemExit(main())
