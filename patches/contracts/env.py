"""Every environment variable that verl-consistency reads or sets, defined once.

The first three names are the public recipe's, kept so that users' existing launch scripts
still work. Every other name is ours and carries the ``VERL_CONSISTENCY_`` prefix; no module
outside this one spells such a name (``tests/test_layers.py`` fails when one does), so a
search for a name here finds every reader and writer.
"""

from __future__ import annotations

import os
from enum import StrEnum

DUMP_ON = "DUMP_ON"
"""``1`` turns the training-side msprobe dump on (recipe name)."""

PROMPTS_ONLY = "PROMPTS_ONLY"
"""``1`` trims responses so that the training forward covers the prompt (recipe name)."""

DUMP_PHASE = "DUMP_PHASE"
"""Which training phase is dumped: see :class:`DumpPhase` (recipe name)."""

ACTOR_CONFIG = "VERL_CONSISTENCY_ACTOR_CONFIG"
"""Path of the training-side msprobe config. The recipe hard-codes ``/home/config_actor.json``."""

RUN_DIR = "VERL_CONSISTENCY_RUN_DIR"
"""The run folder on the dump volume (see ``verl_consistency.contracts.layout``)."""

DUMP_ROOT = "VERL_CONSISTENCY_DUMP_ROOT"
"""The shared dump volume; runs are folders under it (default ``/dump``, the k8s mount)."""

RUN_ID = "VERL_CONSISTENCY_RUN_ID"
"""The run folder's name, when ``--run-id`` is not given."""

MODEL = "VERL_CONSISTENCY_MODEL"
"""The model path, when ``model=`` is not given."""

CAPTURE = "VERL_CONSISTENCY_CAPTURE"
"""Which requests are captured: ``all`` or ``fraction:F`` (see ``contracts.capture``)."""

TOKEN_LEVEL = "VERL_CONSISTENCY_TOKEN_LEVEL"
"""``1`` turns the token records on (``verl-consistency run --token-level`` sets it)."""

TOKEN_THRESHOLD = "VERL_CONSISTENCY_TOKEN_THRESHOLD"
"""``|Δ log p|`` above which a token counts as drifted (``first_above``; ``patches.hooks.token_mismatch``)."""

KEEP_VERSIONS = "VERL_CONSISTENCY_KEEP_VERSIONS"
"""How many weight versions each trainer rank keeps on the host, so that a request's dumped forward
runs the weights its rollout used (``patches.hooks.older_weights``; default 8, verl's
``max_off_policy_threshold``; 0: every request is dumped at the trainer's own weights)."""

LANE_WRITE = "VERL_CONSISTENCY_LANE_WRITE"
"""Where a dumped FSDP micro batch's lane files are rendered and written: ``helper`` (default) in a
helper process while training goes on, drained at the end of each engine call
(``patches.hooks.lanes.lane_writer``, issue 43); ``inline``: in the training process, before the
next micro batch starts."""

LANE_WRITER_PATH = "VERL_CONSISTENCY_LANE_WRITER_PATH"
"""Set by the training process for the lane writer's helper only: the ``sys.path`` it imports this
bundle with (JSON). Not a user setting."""

WEIGHT_CHECK = "VERL_CONSISTENCY_WEIGHT_CHECK"
"""``0`` turns the per-tensor weight check off (``patches/hooks/training/weight_export.py``,
``rollout/weight_held.py``); it is on in every run folder otherwise: a fingerprint of each tensor at
each weight sync."""

WEIGHT_CHECK_GROUP_MB = "VERL_CONSISTENCY_WEIGHT_CHECK_GROUP_MB"
"""The most MiB of words the weight check sums in one group (``patches/hooks/weights/word_groups.py``,
default 128): its extra device memory during a sync is ~3 groups."""

WEIGHT_CHECK_ARRIVALS = "VERL_CONSISTENCY_WEIGHT_CHECK_ARRIVALS"
"""``1`` also fingerprints each tensor as it arrives in vLLM, before loading, so that a tensor vLLM
holds wrongly is said to have changed on the way or in vLLM's loading (two more prints a sync).
Default: the trainer prints each tensor in the dtype vLLM holds (``rollout.dtype``) and vLLM prints
only what it holds, two prints a sync (``patches/hooks/rollout/weight_held.py``)."""

POOL_RESOURCES = "VERL_CONSISTENCY_POOL_RESOURCES"
"""``pool_prefix=resource`` pairs for the Ray placement hook (``patches.hooks.placement``)."""

# Tooling: read by `make`, the tests and the image build, never by a run.
PIN_SET = "VERL_CONSISTENCY_PIN_SET"
"""Which pin set of ``patches/pins.toml`` is in force: ``current`` (default) or ``next``.

The one switch between upstream generations: ``make PINS=next …`` exports it, and every reader
of a pin (``patches/contracts/pins.py``), every patch series and every image build follows it. Read by
``pins.py`` through this file, so that the name is spelled once."""

CACHE = "VERL_CONSISTENCY_CACHE"
"""Where downloaded upstream distributions are cached (default ``./.cache``)."""

CHECKOV = "VERL_CONSISTENCY_CHECKOV"
"""The checkov binary the k8s tests run (``make test`` builds one in its own venv)."""

DEMO_VENV = "VERL_CONSISTENCY_DEMO_VENV"
"""The venv with real vLLM 0.18.0 for CPU that ``make demo`` builds (``entrypoints/demo/venv.py``)."""

LEAN_DISK = "VERL_CONSISTENCY_LEAN_DISK"
"""``1`` (``.ci/run`` sets it): the tests delete each heavy thing they built once they are done
with it — a demo venv (7-9 GB) after the demo tests, the images and stand-in bases after the image
tests, and ``.venv`` once ``make test-current`` has passed — so that one machine's disk holds one
pin set's heavy artefacts at a time. A CI machine ran out of disk with both sets' venvs and the
images at once (about 25 GB); leave it unset where the venvs and images should stay."""

KUBERAY_CRD = "VERL_CONSISTENCY_KUBERAY_CRD"
"""A KubeRay RayJob CRD (ray.io_rayjobs.yaml) the k8s tests validate against besides the releases
1.1.0 to 1.7.0 of tests/k8s/crds/, e.g. a newer release's (unset: those only)."""


class DumpPhase(StrEnum):
    LOG_PROB = "log_prob"
    UPDATE_ACTOR = "update_actor"
    ALL = "all"


def flag(name: str, environ: os._Environ[str] | dict[str, str] | None = None) -> bool:
    """Read a recipe-style 0/1 flag. Anything but an integer is an error, not a silent 'off'."""
    env = os.environ if environ is None else environ
    raw = env.get(name, "0").strip() or "0"
    try:
        return int(raw) != 0
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r}: expected 0 or 1") from None


def dump_phase(environ: os._Environ[str] | dict[str, str] | None = None) -> DumpPhase:
    env = os.environ if environ is None else environ
    raw = env.get(DUMP_PHASE, DumpPhase.LOG_PROB.value)
    try:
        return DumpPhase(raw)
    except ValueError:
        allowed = ", ".join(p.value for p in DumpPhase)
        raise ValueError(f"environment variable {DUMP_PHASE}={raw!r}: expected one of {allowed}") from None
