"""Property-based check of pairing.py against a second, deliberately plain implementation.

Hypothesis draws random collection runs: several vLLM replicas with TP ranks (one worker pid
per rank), requests that are new, cached, decoding (one token, or one plus speculative tokens),
chunked, prefix-cache hits, resumed after preemption, n>1 children and the same request sent
twice; training micro batches of one, several or no requests on one or all trainer ranks, in
both phases; missing and damaged dump folders (gone, truncated dump.json, a fifo for dump.json
or stack.json); malformed and over-long log lines; weight versions on no record, on every
record or on some, agreeing or not (staleness). Each run is written twice, in the project's
log format (the hooks' fields: ``prompt_tokens``, ``num_computed_tokens``, ``attn_state``,
``dumped``, ``scoped_request_id``, ``lane_request_ids`` and ``weight_version`` on both sides
(per-request lanes in ``req{k}`` folders), ``dump_path``, and the ``spec_tokens`` extension) and
in the public recipe's (none of them; ``step_N/rank_M`` folders; actor dumps under the actor root).

The runs are drawn and written by ``pairing_runs``. The oracle (``pairing_oracle``) reads the
written files itself (stdlib json, no discovery code, no pairing code) and applies the rules as
pairing.py's docstring states them, the plain way: every line into a list, then one rule after
the other. Both must agree on every pair, every request's
verdict, every reason's count and every bad line; and every request seen ends in exactly one
place. A third, ground-truth check: in the project's format no pair is ever a chunk or a
prefix-cache hit (the recipe's format cannot show a prefix hit, so only chunks are checked), nor
a prefill and a micro batch that ran different weights.
"""

from __future__ import annotations

import random
import re
import tempfile
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.postprocess.pairing_oracle import Verdicts, oracle
from tests.postprocess.pairing_runs import LINE_CAP, MicroBatch, Schedule, Step, write_run
from tests.postprocess.pairing_runs import schedule as _schedule  # the name Hypothesis' seed hashes
from verl_consistency.postprocess.pairing import discover
from verl_consistency.postprocess.pairing.discover import Roots
from verl_consistency.postprocess.pairing.pair import pair_run

MAX_EXAMPLES = 500

settings.register_profile(
    "pairing-ci",
    max_examples=MAX_EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# ---------------------------------------------------------------------------------------------
# The property.
# ---------------------------------------------------------------------------------------------

STATS = Counter()


def _implementation(paths: dict[str, Path], recipe: bool) -> tuple[Verdicts, Any]:
    roots = Roots.open(paths["run"], paths["rollout"], paths["actor"])
    res = pair_run(roots)
    got = Verdicts()
    got.pairs = {(p.request_id, p.vllm_request_id, p.rollout.dir, p.actor.dir) for p in res.pairs}
    got.requests = {u.ref: u.reason.value for u in res.unpaired if u.subject == "request"}
    got.counts = Counter(
        {(subject, reason): n for subject, by in res.counts.items() for reason, n in by.items()}
    )
    got.bad_lines = {u.ref for u in res.unpaired if u.reason.value == "bad_log_line"}
    return got, res


def _truth(s: Schedule) -> dict[str, str]:
    """vLLM id -> whole / hit / chunk, and 'chunk1' for a chunk whose every later chunk was one
    token: in the recipe's format that is indistinguishable from a decode (the rule calls it one)."""
    truth = {e.vid: e.truth for st_ in s.steps for e in st_.entries if e.truth}
    later: dict[str, set[int]] = defaultdict(set)
    for st_ in s.steps:
        for e in st_.entries:
            if e.type == "cached" and truth.get(e.vid) == "chunk" and not e.spec:
                later[e.vid].add(e.tokens)
    return {v: "chunk1" if t == "chunk" and later[v] <= {1} else t for v, t in truth.items()}


def _versions_of(s: Schedule, pair: Any) -> tuple[int | None, int | None]:
    """The weight versions that the schedule gave a pair's prefill step and micro batch, found
    from its dump folders (``rollout/<pid>/step<N>/rank<r>``, ``actor/<pid>/step<n>/rank<r>``):
    the writer's pids are 1000 + 10 * replica + rank and 2000 + rank, and a trainer rank's
    step n is its n-th micro batch."""
    m = re.match(r"rollout/(\d+)/step(\d+)/", pair.rollout.dir)
    assert m, pair.rollout.dir
    replica, step_n = (int(m.group(1)) - 1000) // 10, int(m.group(2))
    step: Step = next(x for x in s.steps if (x.replica, x.step) == (replica, step_n))
    m = re.match(r"actor/(\d+)/step(\d+)/", pair.actor.dir)
    assert m, pair.actor.dir
    rank, n = int(m.group(1)) - 2000, int(m.group(2))
    batch: MicroBatch = [b for b in s.batches if rank in b.ranks][n]
    return step.version, batch.version


@settings(settings.get_profile("pairing-ci"))
@given(st.integers(min_value=0, max_value=2**63 - 1))
def test_pairing_agrees_with_a_plain_oracle(seed: int):
    """Hypothesis draws the seed (uniform choices cover far more than its shrink-friendly
    randoms, which lean towards the first option); a failure prints the seed to replay."""
    s = _schedule(random.Random(seed))
    truth = _truth(s)
    with tempfile.TemporaryDirectory() as tmp, mock.patch.object(discover, "MAX_LINE", LINE_CAP):
        for recipe in (False, True):
            paths = write_run(s, Path(tmp) / ("recipe" if recipe else "project"), recipe)
            want = oracle(paths, recipe)
            got, res = _implementation(paths, recipe)
            fmt = "recipe" if recipe else "project"
            assert got.pairs == want.pairs, fmt
            assert got.requests == want.requests, fmt
            assert got.bad_lines == want.bad_lines, fmt
            assert got.counts == want.counts, fmt
            # exactly one place per request
            paired = {p[0] for p in got.pairs}
            assert not paired & set(got.requests), fmt
            assert res.requests_seen == len(paired) + len(got.requests), fmt
            assert (res.requests_paired, res.requests_unpaired) == (len(paired), len(got.requests)), fmt
            # never a wrong pair (the recipe's format cannot show a prefix hit, nor a last chunk of one token)
            allowed = ("whole", "hit", "chunk1") if recipe else ("whole",)
            for p in res.pairs:
                assert truth.get(p.vllm_request_id, "whole") in allowed, (fmt, p)
                if not recipe:  # never two sets of weights (the recipe's format has no versions)
                    roll_v, act_v = _versions_of(s, p)
                    assert roll_v is None or act_v is None or roll_v == act_v, (fmt, p, roll_v, act_v)
                    STATS[fmt, "pairs with versions"] += roll_v is not None and act_v is not None
            STATS[fmt, "examples"] += 1
            STATS[fmt, "pairs"] += len(res.pairs)
            STATS[fmt, "requests"] += res.requests_seen
            for reason in got.requests.values():
                STATS[fmt, reason] += 1
            for (subject, reason), k in got.counts.items():
                if subject != "request":
                    STATS[fmt, f"{subject}:{reason}"] += k


def test_zz_report_examples(capsys):
    """Prints what the property test covered (run in the same session, after it)."""
    with capsys.disabled():
        print("\npairing property test, totals over all examples:")
        for fmt in ("project", "recipe"):
            print(f"  {fmt}: " + ", ".join(f"{k[1]}={n}" for k, n in sorted(STATS.items()) if k[0] == fmt))
    if STATS:
        assert STATS["project", "examples"] >= MAX_EXAMPLES
