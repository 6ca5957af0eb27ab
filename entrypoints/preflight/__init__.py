"""``verl-consistency preflight``: read the cluster and the manifest, say what will fail before submission."""
