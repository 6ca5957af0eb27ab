"""Hooks that run in every Ray worker process as it starts, before verl or vLLM is imported.

``placement``: a ``worker_process_setup_hook`` that pins verl's resource pools to Ray worker groups.
"""
