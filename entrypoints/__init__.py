"""verl-consistency: does the training engine compute what the inference engine computed?

This package's root lives in ``entrypoints/``: the ``verl-consistency`` command and the run
contract it decides (dump layout, environment, overrides, run manifest).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("verl-consistency")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+unknown"
