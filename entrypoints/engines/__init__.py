"""The single-node engine stages that ``demo``, ``check`` and ``bench`` share.

vLLM and verl's FSDP engine, each in its own subprocess, and what runs them.
"""
