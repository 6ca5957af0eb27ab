"""A stand-in engine process for ``engines.session``'s tests: no engine, only the line protocol.

``python -m tests.entrypoints.session_standin ROLE`` serves ``echo`` (answers its arguments),
``fail`` (raises) and ``block`` (never answers, as a weight sender whose receiver is gone).
"""

from __future__ import annotations

import time
from typing import Any

from verl_consistency.entrypoints.engines.session import serve


def _fail(args: dict[str, Any]) -> dict[str, Any]:
    raise RuntimeError(f"the stand-in fails as asked: {args}")


def _block(_args: dict[str, Any]) -> dict[str, Any]:
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    raise SystemExit(serve({"echo": lambda args: {"echo": args}, "fail": _fail, "block": _block}))
