"""The tool that fetches the pinned upstreams and applies the diffs: ``apply``, ``upstream`` and the
``verl-consistency patches`` / ``python -m verl_consistency.patches`` command line (``cli``).

It runs on the host and in the image build, never inside vLLM or verl, and imports no hook.
"""
