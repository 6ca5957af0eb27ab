"""Hooks that run in the rollout's processes: the vLLM worker and verl's agent loop that calls it.

``dispatch`` (the vLLM model runner's dispatch log and its msprobe steps), ``request_scope`` (which
requests of a packed step are dumped, and how msprobe is told), ``request_ids`` (verl's agent loop
threads each trajectory's vLLM request id into the batch). They never import the training room:
what both sides share is in ``verl_consistency.contracts``, and the per-request msprobe dumps come
from ``patches.hooks.lanes``.
"""
