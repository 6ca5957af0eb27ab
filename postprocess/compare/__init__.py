"""Comparing: msprobe compare on each pair, verdicts, the batch variance and the token view."""
