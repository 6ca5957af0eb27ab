"""The upstream side of verl-consistency: version pins, unified diffs and the tool that applies them.

The diffs themselves live next to this file, one folder per pin set and upstream
(``current/verl/``, ``next/vllm-ascend/``, ...), each with a ``series`` file, so that the wheel, the
Dockerfile and ``make check-patches`` all read the same copies.
"""
