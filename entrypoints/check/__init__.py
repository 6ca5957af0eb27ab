"""``verl-consistency check``: vLLM batched and alone against the training engine, on one node."""
