"""``verl-consistency``: the command line, and the run command's plan (env, overrides, configs).

This is the top of the import graph: it may import every other sub-package; nothing imports it.
"""
