"""The postprocess: pair rollout and training dumps by request id, compare, report, bundle.

Stages and their rooms (each module small, each tested on its own): ``pipeline`` runs
``pairing`` (read the logs, pair prefills with micro batches) → ``compare`` (msprobe compare,
the verdicts, the token view) → ``output`` (report, per-step table, bundle); ``cli`` is its
commands. The data passed between stages is typed where it is made (``pairing.pair_types``,
``compare.verdict``), and what crosses a process is a contract (``verl_consistency.contracts``).
"""
