"""Pairing: read the logs without trusting them, and pair prefills with micro batches by request id."""
