"""``python -m verl_consistency.entrypoints`` is the same command as ``verl-consistency``."""

from verl_consistency.entrypoints.cli import main

raise SystemExit(main())
