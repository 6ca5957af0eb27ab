"""The postprocess: pair rollout and training dumps by request id, compare, report, bundle.

Stages and their modules (each small, each tested on its own):
``model`` (the data passed between stages) → pairing → compare → report → bundle.
"""
