"""The command-line options that ``check`` and ``demo`` share, spelled once (pip's ``cmdoptions``).

Both commands run the same two engines on one node (vLLM, then verl's FSDP engine) on prompts of
the embedded set, so several options mean the same thing in both: spelled in each signature they
drift apart (one help text said "prompts", the other "requests"; one bounded the count, the other
did not). Each is a typer ``Annotated`` type; a command keeps its own default, which is where the
two legitimately differ (``out/check`` vs ``out/demo``, one request per forward vs eight).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

MAX_PROMPTS = 512
"""More prompts than this in one check or demo is a collection run's job (``verl-consistency run``)."""

DumpRoot = Annotated[
    Path, typer.Option("--dump-root", help="where the run folder, the models and bundles/ go")
]
EmbeddedPrompts = Annotated[int, typer.Option(min=1, max=MAX_PROMPTS, help="prompts from the embedded set")]
MicroBatch = Annotated[
    int,
    typer.Option(
        min=1,
        help="requests per training forward, as verl's log_prob_micro_batch_size_per_gpu; each "
        "captured request of a micro batch is dumped in a lane of its own",
    ),
]
MaxNumBatchedTokens = Annotated[
    int | None, typer.Option(help="vLLM scheduler token budget per step (default: vLLM's)")
]
