"""``python -m verl_consistency`` is the same command as ``verl-consistency``."""

from verl_consistency.cli import main

raise SystemExit(main())
