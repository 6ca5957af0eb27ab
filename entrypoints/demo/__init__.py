"""``verl-consistency demo``: a real collection on CPU, and the venv it runs in."""
