"""The plan file format `schedlang.plan/1`: round trips and located errors."""
from __future__ import annotations

import json

import pytest

from schedlang.language.errors import DataError
from schedlang.plans.plan import SCHEMA, Op, Plan


def sample_plan() -> Plan:
    return Plan(
        graph="vgg16_train",
        ops=[
            Op("compute", node="block1_conv1"),
            Op("compute", node="fwd_block1", option="recompute"),
            Op("delete", data="block1_conv1"),
            Op("drop_phantom", layer="block1"),
            Op("offload", data="h1", fraction=1.0),
            Op("prefetch", data="h1", fraction=0.5),
            Op("wait", channel="prefetch", data="h1"),
        ],
        budget_peak=14242598093,
        predicted_peak=13153337344,
        predicted_time=15805.0,
        meta={"planner": "test"},
    )


def test_to_json_matches_the_documented_format():
    obj = sample_plan().to_json()
    assert obj["schema"] == "schedlang.plan/1" == SCHEMA
    assert obj["graph"] == "vgg16_train"
    assert obj["budget"] == {"peak_bytes": 14242598093, "save_bytes": None}
    assert obj["predicted"] == {"peak_bytes": 13153337344, "time": 15805.0}
    assert obj["ops"] == [
        {"op": "compute", "node": "block1_conv1"},
        {"op": "compute", "node": "fwd_block1", "option": "recompute"},
        {"op": "delete", "data": "block1_conv1"},
        {"op": "drop_phantom", "layer": "block1"},
        {"op": "offload", "data": "h1", "fraction": 1.0},
        {"op": "prefetch", "data": "h1", "fraction": 0.5},
        {"op": "wait", "data": "h1", "channel": "prefetch"},
    ]
    assert list(obj)[:5] == ["schema", "graph", "budget", "ops", "predicted"]
    assert obj["meta"] == {"planner": "test"}
    # a plan without meta writes no meta key
    assert "meta" not in Plan(graph="g", ops=[]).to_json()


def test_round_trip_through_a_file(tmp_path):
    plan = sample_plan()
    path = tmp_path / "plan.json"
    plan.save(path)
    assert Plan.load(path) == plan
    # the file is plain JSON that other tools can read
    obj = json.loads(path.read_text())
    assert obj == plan.to_json()
    # and the text is deterministic
    plan.save(tmp_path / "again.json")
    assert (tmp_path / "again.json").read_text() == path.read_text()


def test_round_trip_of_an_empty_plan_and_nulls():
    plan = Plan(graph="g", ops=[])
    back = Plan.from_json(json.loads(json.dumps(plan.to_json())))
    assert back == plan
    assert back.budget_peak is None and back.predicted_time is None


def test_the_architecture_example_loads():
    obj = {
        "schema": "schedlang.plan/1",
        "graph": "vgg16_train",
        "budget": {"peak_bytes": 14242598093, "save_bytes": None},
        "ops": [{"op": "compute", "node": "block1_conv1"},
                {"op": "wait", "channel": "prefetch", "data": "h1"}],
        "predicted": {"peak_bytes": 13153337344, "time": 15805},
    }
    plan = Plan.from_json(obj)
    assert plan.predicted_time == 15805.0 and isinstance(plan.predicted_time, float)
    assert plan.ops[1] == Op("wait", data="h1", channel="prefetch")
    assert plan.to_json()["ops"] == obj["ops"]


def test_float_byte_counts_are_written_as_integers():
    plan = Plan(graph="g", ops=[], budget_peak=100.0, predicted_peak=99.9999999)
    obj = plan.to_json()
    assert obj["budget"]["peak_bytes"] == 100 and isinstance(obj["budget"]["peak_bytes"], int)
    assert obj["predicted"]["peak_bytes"] == 100
    assert Plan.from_json(obj).predicted_peak == 100


def write(tmp_path, text: str):
    path = tmp_path / "bad.json"
    path.write_text(text)
    return path


def load_error(path) -> DataError:
    with pytest.raises(DataError) as info:
        Plan.load(path)
    return info.value


def test_json_syntax_error_is_located(tmp_path):
    path = write(tmp_path, '{\n  "schema": "schedlang.plan/1",\n  "graph": "g"\n  "ops": []\n}\n')
    err = load_error(path)
    assert err.loc.path == str(path)
    assert (err.loc.line, err.loc.col) == (4, 3)
    assert str(err).startswith(f"{path}:4:3: error: invalid JSON")


def test_wrong_schema(tmp_path):
    obj = sample_plan().to_json()
    obj["schema"] = "schedlang.plan/9"
    err = load_error(write(tmp_path, json.dumps(obj)))
    assert str(err).startswith(str(tmp_path / "bad.json"))
    assert "schedlang.plan/9" in err.message and "schedlang.plan/1" in err.message
    del obj["schema"]
    assert "missing 'schema'" in load_error(write(tmp_path, json.dumps(obj))).message


def test_unknown_op_names_its_index(tmp_path):
    obj = sample_plan().to_json()
    obj["ops"][3] = {"op": "comptue", "node": "x"}
    err = load_error(write(tmp_path, json.dumps(obj)))
    assert str(tmp_path / "bad.json") in str(err)
    assert "op 3" in err.message and "'comptue'" in err.message
    assert "did you mean 'compute'" in err.message


@pytest.mark.parametrize("op, expected", [
    ({"op": "compute"}, "op 1: compute op is missing field 'node'"),
    ({"op": "delete", "node": "a"}, "op 1: unexpected field 'node' in a delete op"),
    ({"node": "a"}, "op 1: missing field 'op'"),
    ({"op": 3}, "op 1: field 'op' must be a string"),
    ({"op": "compute", "node": 7}, "op 1: field 'node' must be a string"),
    ({"op": "offload", "data": "h", "fraction": 1.5}, "op 1: field 'fraction' must be between"),
    ({"op": "wait"}, "op 1: wait op is missing field 'channel'"),
    ("compute a", "op 1: an op is a JSON object"),
])
def test_bad_ops_are_reported_with_their_index(tmp_path, op, expected):
    obj = {"schema": SCHEMA, "graph": "g", "ops": [{"op": "compute", "node": "a"}, op]}
    err = load_error(write(tmp_path, json.dumps(obj)))
    assert expected in err.message
    assert err.loc.path == str(tmp_path / "bad.json")


@pytest.mark.parametrize("obj, expected", [
    ([], "a plan file holds a JSON object"),
    ({"schema": SCHEMA, "ops": []}, "missing 'graph'"),
    ({"schema": SCHEMA, "graph": "g"}, "missing 'ops'"),
    ({"schema": SCHEMA, "graph": "g", "ops": {}}, "'ops' must be a list"),
    ({"schema": SCHEMA, "graph": "g", "ops": [], "budget": {"peak_bytes": -1}},
     "'budget.peak_bytes' must not be negative"),
    ({"schema": SCHEMA, "graph": "g", "ops": [], "budget": {"peak_bytes": 1.5}},
     "'budget.peak_bytes' must be a whole number"),
    ({"schema": SCHEMA, "graph": "g", "ops": [], "predicted": {"time": "fast"}},
     "'predicted.time' must be a number"),
])
def test_bad_top_level_fields(tmp_path, obj, expected):
    err = load_error(write(tmp_path, json.dumps(obj)))
    assert expected in err.message
    assert str(err).startswith(str(tmp_path / "bad.json") + ": error: ")


def test_missing_file_is_a_data_error(tmp_path):
    err = load_error(tmp_path / "nope.json")
    assert "cannot read plan file" in err.message
    assert err.loc.path == str(tmp_path / "nope.json")
