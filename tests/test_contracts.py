"""The contracts between stages: log records, environment and dump layout."""

from __future__ import annotations

import orjson
import pytest

from verl_consistency.contracts import env, layout, records


def test_dispatch_record_keeps_the_recipe_field_names(tmp_path):
    path = tmp_path / "1234" / records.DISPATCH_LOG
    w = records.JsonlWriter(path)
    w.write(
        records.DispatchRecord(
            timestamp=records.now(),
            pid=1234,
            rank=0,
            step=3,
            phase="prefill",
            attn_state="PrefillNoCache",
            total_num_scheduled_tokens=95,
            requests=[records.ScheduledRequest(request_id="f1f2-12345678", type="new", tokens=95)],
        )
    )
    w.close()
    (line,) = path.read_bytes().splitlines()
    rec = orjson.loads(line)
    recipe = {"source", "timestamp", "pid", "rank", "step", "phase", "total_num_scheduled_tokens", "requests"}
    assert recipe <= rec.keys()
    assert rec["source"] == "dispatch_logger"
    assert rec["requests"] == [{"request_id": "f1f2-12345678", "type": "new", "tokens": 95}]


def test_update_actor_record_round_trips_and_tolerates_new_fields():
    raw = {
        "source": "update_actor",
        "timestamp": "2026-05-13T10:00:01",
        "pid": 1,
        "rank": 0,
        "step": 0,
        "request_ids": ["abc"],
        "num_requests": 1,
        "from_the_future": True,
    }
    rec = records.UpdateActorRecord.model_validate(raw)
    assert rec.request_ids == ["abc"]
    assert rec.model_extra == {"from_the_future": True}


def test_weight_version_is_optional_on_both_sides_and_written_only_when_known(tmp_path):
    """Older logs (and the recipe's) have no weight_version: they read as None, so the pairing
    pairs them as before; a known version round-trips, an unknown one is not written at all."""
    old_dispatch = {
        "timestamp": "t",
        "pid": 1,
        "rank": 0,
        "step": 0,
        "phase": "prefill",
        "total_num_scheduled_tokens": 3,
        "requests": [{"request_id": "a", "type": "new", "tokens": 3}],
    }
    old_actor = {"timestamp": "t", "pid": 2, "rank": 0, "step": 0, "request_ids": ["a"], "num_requests": 1}
    assert records.DispatchRecord.model_validate(old_dispatch).weight_version is None
    assert records.UpdateActorRecord.model_validate(old_actor).weight_version is None

    path = tmp_path / records.UPDATE_ACTOR_LOG
    w = records.JsonlWriter(path)
    w.write(records.DispatchRecord.model_validate(old_dispatch | {"weight_version": 3}))
    w.write(records.UpdateActorRecord.model_validate(old_actor | {"weight_version": 4}))
    w.write(records.UpdateActorRecord.model_validate(old_actor))
    w.close()
    written = [orjson.loads(x) for x in path.read_bytes().splitlines()]
    assert [r.get("weight_version", "absent") for r in written] == [3, 4, "absent"]
    with pytest.raises(ValueError, match="weight_version"):
        records.UpdateActorRecord.model_validate(old_actor | {"weight_version": "step 4"})


def test_writer_appends_so_a_restarted_worker_keeps_earlier_lines(tmp_path):
    path = tmp_path / records.UPDATE_ACTOR_LOG
    for step in range(2):
        w = records.JsonlWriter(path)
        w.write(
            records.UpdateActorRecord(timestamp="t", pid=1, rank=0, step=step, request_ids=[], num_requests=0)
        )
        w.close()
    assert [orjson.loads(x)["step"] for x in path.read_bytes().splitlines()] == [0, 1]


@pytest.mark.parametrize(("raw", "expected"), [("1", True), ("0", False), ("", False), (" 2 ", True)])
def test_flag_reads_recipe_style_switches(raw, expected):
    assert env.flag(env.DUMP_ON, {env.DUMP_ON: raw}) is expected


def test_flag_refuses_garbage_instead_of_silently_turning_off():
    with pytest.raises(ValueError, match="DUMP_ON='yes'"):
        env.flag(env.DUMP_ON, {env.DUMP_ON: "yes"})


def test_dump_phase_defaults_to_log_prob_and_refuses_typos():
    assert env.dump_phase({}) is env.DumpPhase.LOG_PROB
    with pytest.raises(ValueError, match="log_prob, update_actor, all"):
        env.dump_phase({env.DUMP_PHASE: "logprob"})


def test_layout_paths_and_run_ids(tmp_path):
    rid = layout.new_run_id("fully-async", now=0)
    assert rid.startswith("fully-async-19700101-000000-")
    lay = layout.RunLayout(tmp_path, rid)
    assert lay.bundle == tmp_path / "bundles" / f"bundle-{rid}.tar.zst"
    assert lay.actor_config.relative_to(lay.run_dir).as_posix() == layout.ACTOR_CONFIG
    assert layout.RunLayout.from_run_dir(lay.run_dir) == lay
    with pytest.raises(ValueError, match="must match"):
        layout.RunLayout(tmp_path, "../escape")


def test_relative_to_run_keeps_outside_paths_absolute(tmp_path):
    run = tmp_path / "run"
    inside = run / "rollout" / "7"
    inside.mkdir(parents=True)
    assert layout.relative_to_run(inside, run) == "rollout/7"
    assert layout.relative_to_run(tmp_path / "elsewhere", run) == (tmp_path / "elsewhere").as_posix()


@pytest.mark.parametrize(
    ("vllm_id", "expected"),
    [
        ("f1f254c04e0c443b85ea1e7359e842dc-1a2b3c4d", ("f1f254c04e0c443b85ea1e7359e842dc", None)),
        ("3_f1f254c04e0c443b85ea1e7359e842dc-1a2b3c4d", ("f1f254c04e0c443b85ea1e7359e842dc", 3)),
        ("f1f254c04e0c443b85ea1e7359e842dc", ("f1f254c04e0c443b85ea1e7359e842dc", None)),
        ("my-custom-id-12345678", ("my-custom-id", None)),
        ("my-custom-id-XYZ", ("my-custom-id-XYZ", None)),
        ("abc-1A2B3C4D", ("abc-1A2B3C4D", None)),  # upper case is not vLLM's suffix
    ],
)
def test_split_vllm_request_id(vllm_id, expected):
    assert records.split_vllm_request_id(vllm_id) == expected


def test_capture_rule_is_deterministic_and_close_to_its_fraction():
    from verl_consistency.contracts import capture

    rule = capture.parse("fraction:0.1")
    ids = [f"{i:032x}" for i in range(20000)]
    chosen = [i for i in ids if rule.captures(i)]
    assert 1700 < len(chosen) < 2300
    assert chosen == [i for i in ids if capture.parse("fraction:0.1").captures(i)]
    assert all(capture.parse("all").captures(i) for i in ids[:10])
    assert capture.parse(rule.spec()) == rule


@pytest.mark.parametrize("bad", ["fraction:0", "fraction:1.5", "fraction:x", "first:3", "some"])
def test_capture_rule_refuses_bad_specs(bad):
    from verl_consistency.contracts import capture

    with pytest.raises(ValueError, match="VERL_CONSISTENCY_CAPTURE"):
        capture.parse(bad)
