"""The contracts between the stages, each written once and imported by every side.

| module | the contract | written by | read by |
|---|---|---|---|
| ``env`` | every environment variable name | entrypoints, k8s, the image | hooks, entrypoints |
| ``layout`` | the dump root and run folder: where each file lives | entrypoints | hooks, postprocess |
| ``records`` | ``dispatch_log.jsonl`` / ``update_actor_log.jsonl`` lines | hooks | postprocess |
| ``token_records`` | ``token_mismatch*.jsonl``, ``next_token.jsonl`` | hooks | postprocess |
| ``capture`` | which requests a collection run captures | entrypoints | hooks (both sides) |
| ``run_manifest`` | ``run.json`` | entrypoints | postprocess |
| ``check_run`` | ``check.json``: a check run's two vLLM ids per prompt | entrypoints (check) | postprocess |
| ``batch_fields`` | the fields one hook adds to verl's batch and another reads | hooks | hooks |
| ``weight_labels`` | a weight sync's label and the keyword that carries it | hooks | hooks |
| ``atomic`` | how every file is written (temp file, then rename) | every stage | |
| ``msprobe_scope`` | a request-scoped msprobe config: sentinel, module lists | entrypoints | hooks |
| ``process_local`` | a hook's per-process state (a forked child starts fresh) | hooks | hooks |
| ``weight_records`` | ``weights/*.jsonl``: the weight check's records | hooks | postprocess |
| ``safe_tar`` | which members of an untrusted tar are written | | bundle reader, model loader |

The version pins are the one contract kept outside, in ``patches/pins.toml`` beside their
reader ``patches/contracts/pins.py``: the Makefile and the image build read them before this package is
installed. Nothing here imports torch, vLLM, verl or msprobe: the hooks import these modules
inside vLLM and trainer processes, and the postprocess imports them on machines without either.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("verl-consistency")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+unknown"
