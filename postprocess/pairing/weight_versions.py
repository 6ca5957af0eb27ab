"""Which prefills and micro batches of one request ran the same weights (``pair.py``'s
docstring, "Matching", step 2).

Under RL the weights move: vLLM computes with the weights of the last sync it received, and in
the async modes a request generated with step k's weights is trained at step k+1 or later
(staleness). Such a prefill and such a micro batch differ by the weights alone, so comparing them
would blame the engines for an optimizer step. Each record says which weights it ran with
(``weight_version``, ``contracts/records.py``); only equal versions pair, and a request whose
versions never agree is ``weights_differ``, with both sides' versions named: staleness, seen.
A record without a version (older logs, the recipe's format) agrees with every version, so such
runs pair exactly as before. A training record with ``unsynced_updates`` > 0 ran weights that no
sync carried (optimizer steps after the sync it names): it agrees with no version.
"""

from __future__ import annotations

from typing import Any

from verl_consistency.postprocess.pairing.candidates import Candidate
from verl_consistency.postprocess.pairing.pair_types import Unpaired, UnpairedReason
from verl_consistency.postprocess.pairing.reasons import Reporter

R = UnpairedReason


def read_version(o: dict[str, Any]) -> int | None:
    """A record's ``weight_version``: an integer, or None when absent or null. Raises
    ``TypeError`` (the reader reports the line as ``bad_log_line``) for anything else: a
    version that cannot be compared must not silently pair."""
    v = o.get("weight_version")
    if v is not None and type(v) is not int:
        raise TypeError("weight_version must be an integer")
    return v


def read_unsynced(o: dict[str, Any]) -> int:
    """A training record's ``unsynced_updates``: 0 when absent. Raises ``TypeError`` (a
    ``bad_log_line``) unless a non-negative integer."""
    v = o.get("unsynced_updates", 0)
    if type(v) is not int or v < 0:
        raise TypeError("unsynced_updates must be a non-negative integer")
    return v


def read_trainer_version(o: dict[str, Any]) -> int | None:
    """A training record's ``trainer_weight_version`` (``hooks/training/older_weights.py``): an int or None.
    Raises ``TypeError`` (a ``bad_log_line``) for anything else."""
    v = o.get("trainer_weight_version")
    if v is not None and type(v) is not int:
        raise TypeError("trainer_weight_version must be an integer")
    return v


def _agrees(c: Candidate, version: int) -> bool:
    if c.unsynced:
        return False
    return c.version is None or c.version == version


def _text(c: Candidate) -> str:
    """A candidate's weights in words: ``step 3``, or ``step 3 + 2 unsynced updates``."""
    if c.unsynced:
        s = "" if c.unsynced == 1 else "s"
        return f"step {c.version} + {c.unsynced} optimizer step{s} not synced to vLLM"
    return f"step {c.version}"


def steps_text(versions: set[int]) -> str:
    """``step 3`` or ``steps 3, 5``: the versions of one side, for a reason's detail."""
    ordered = sorted(versions)
    return ("step " if len(ordered) == 1 else "steps ") + ", ".join(map(str, ordered))


def _side_text(cands: list[Candidate]) -> str:
    """One side's weights for a reason's detail: its synced versions, then any unsynced ones."""
    synced = {c.version for c in cands if c.version is not None and not c.unsynced}
    parts = [steps_text(synced)] if synced else []
    parts += sorted({_text(c) for c in cands if c.unsynced})
    return "; ".join(parts) or "no known step"


def same_weights(
    key: str, rolls: list[Candidate], acts: list[Candidate], rep: Reporter
) -> tuple[list[Candidate], list[Candidate]] | None:
    """One request's prefills and micro batches that ran the same weights.

    When both sides hold at least one version, the request's version is the lowest ``v`` for
    which each side has a candidate of version ``v`` or of none; the candidates of another
    version are set aside (each listed as a ``rollout_step``/``actor_step`` ``weights_differ``).
    When no such ``v`` exists (then every candidate has a version), the request is
    ``weights_differ`` and None is returned. When a side holds no version at all, nothing is
    set aside: the pairing is the one it always was.
    """
    roll_versions = {c.version for c in rolls if c.version is not None}
    act_versions = {c.version for c in acts if c.version is not None}
    if not roll_versions or not act_versions:
        if any(c.unsynced for c in acts):  # never the same weights as any sync, known or not
            kept = [c for c in acts if not c.unsynced]
            for c in acts:
                if c.unsynced:
                    _aside(c, None, rep)
            if not kept:
                rep.request(
                    key,
                    R.WEIGHTS_DIFFER,
                    "the trainer's forward ran weights of {}",
                    _side_text(acts),
                )
                return None
            return rolls, kept
        return rolls, acts
    for v in sorted(roll_versions | act_versions):
        if any(_agrees(c, v) for c in rolls) and any(_agrees(c, v) for c in acts):
            return _set_aside(rolls, v, rep), _set_aside(acts, v, rep)
    rep.request(
        key,
        R.WEIGHTS_DIFFER,
        "vLLM computed with weights of {}, the trainer's forward was at {}",
        steps_text(roll_versions),
        _side_text(acts),
    )
    return None


def _set_aside(cands: list[Candidate], version: int, rep: Reporter) -> list[Candidate]:
    kept = []
    for c in cands:
        if _agrees(c, version):
            kept.append(c)
        else:
            _aside(c, version, rep)
    return kept


def _aside(c: Candidate, version: int | None, rep: Reporter) -> None:
    """List one step set aside for its weights (``version``: the step the request pairs at)."""
    who = "vLLM computed it" if c.side == "rollout" else "the trainer's forward ran"
    tail = f"; the request pairs at step {version}" if version is not None else ""
    rep(
        Unpaired(
            subject="rollout_step" if c.side == "rollout" else "actor_step",
            ref=c.ref,
            reason=R.WEIGHTS_DIFFER,
            detail=f"{who} with weights of {_text(c)}{tail}",
        )
    )
