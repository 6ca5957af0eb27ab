"""``verl-consistency load``: put a model folder, a dataset or a reward file onto a volume."""
