"""Stats format v1: validation errors name the field and value; PyTorch interop."""

import copy
import json
import sys
from pathlib import Path

import pytest

from planner import STATS_FORMAT, Stats, StatsError, load_stats, parse_stats, plan, stats_hash

DATA = Path(__file__).resolve().parents[1] / "data"
L4 = DATA / "torch_format_transformer_L4.json"
L12 = Path(__file__).resolve().parents[1] / "data" / "torch_format_transformer_L12.json"  # a copy of ../shared/reference's


def small_doc():
    ops = [
        {"name": "aten.mm", "runtime_ms": 1.0, "output_bytes": 400, "saved_by_autograd": True},
        {"name": "aten.view", "runtime_ms": 0.0, "output_bytes": 0, "view_like": True},
        {"name": "aten.relu_", "runtime_ms": 0.1, "output_bytes": 0, "inplace_parent": 0},
        {"name": "aten.native_dropout", "runtime_ms": 0.2, "output_bytes": 100, "random": True},
    ]
    return {
        "format": STATS_FORMAT,
        "metadata": {"model_name": "tiny", "batch_size": 2, "seq_len": 8, "tags": {"team": "x"}},
        "fw_pre_order": ["M", "M.block", "M.block.lin", "M.head"],
        "fw_post_order": ["M.block.lin", "M.block", "M.head", "M"],
        "modules": [
            {"fqn": "M", "parent": None, "is_leaf": False, "param_bytes": 1000, "act_total_bytes": 900},
            {"fqn": "M.block", "parent": "M", "is_leaf": False, "act_saved_bytes": 500, "act_total_bytes": 600,
             "ops": ops},
            {"fqn": "M.block.lin", "parent": "M.block", "is_leaf": True, "act_total_bytes": 400},
            {"fqn": "M.head", "parent": "M", "is_leaf": True, "act_total_bytes": 800},
        ],
    }


def test_small_doc_is_valid():
    s = parse_stats(small_doc())
    assert s.root.fqn == "M"
    assert s.module("M.block").op_bytes == 500


def _broken(edit):
    doc = small_doc()
    edit(doc)
    return doc


@pytest.mark.parametrize("edit,match", [
    (lambda d: d["modules"][3].update(fqn="M.block"), r"modules\[3\]\.fqn 'M.block' duplicates modules\[1\]"),
    (lambda d: d["fw_pre_order"].pop(), "fw_pre_order has 3 entries but there are 4 modules"),
    (lambda d: d["fw_post_order"].__setitem__(0, "M.nope"), r"fw_post_order\[0\] 'M.nope' is not a module fqn"),
    (lambda d: d["fw_post_order"].__setitem__(1, "M.block.lin"), r"fw_post_order\[1\] 'M.block.lin' appears twice"),
    (lambda d: d["modules"][3].update(parent="M.block.lin"), "is not a prefix module"),
    (lambda d: d["modules"][3].update(parent="X"), r"modules\[3\]\.parent 'X' is not a module fqn"),
    (lambda d: d["modules"][1]["ops"][2].update(inplace_parent=91), r"modules\[1\]\.ops\[2\]\.inplace_parent 91 is out of range for 4 ops"),
    (lambda d: d["modules"][1]["ops"][0].update(runtime_ms=-1.0), r"modules\[1\]\.ops\[0\]\.runtime_ms: .*\(got -1\.0\)"),
    (lambda d: d["modules"][0].update(param_bytes=-5), r"modules\[0\]\.param_bytes: .*\(got -5\)"),
    (lambda d: d["modules"][0].update(param_bytes=10**30), r"modules\[0\]\.param_bytes: .*\(got 10{30}\)"),
    (lambda d: d["modules"][0].update(fw_ms=float("inf")), r"modules\[0\]\.fw_ms: must be a finite number, got inf"),
    (lambda d: d["modules"][1].update(is_leaf=True), r"modules\[1\]\.is_leaf is true but 'M.block' has submodules"),
    (lambda d: d["modules"][0].update(parent="M.head"), "exactly one root"),
    (lambda d: d.update(format="sacplan.stats/v9"), "format"),
    (lambda d: d["modules"][1]["ops"][1].update(inplace_parent=1), "contradictory SAC rules"),
    (lambda d: d["modules"][0].update(colour="red"), r"modules\[0\]\.colour: Extra inputs are not permitted \(got 'red'\)"),
    # orders that are not depth-first walks: another branch inside a subtree's run
    (lambda d: d.update(fw_post_order=["M.block.lin", "M.head", "M.block", "M"]),
     r"fw_post_order\[1\] 'M.head' is not a submodule of 'M.block' but lies inside the run of its submodules, "
     r"fw_post_order\[1:3\]"),
    (lambda d: d.update(fw_pre_order=["M", "M.block", "M.head", "M.block.lin"]),
     r"fw_pre_order\[2\] 'M.head' is not a submodule of 'M.block'"),
    (lambda d: d.update(fw_pre_order=["M.block", "M", "M.block.lin", "M.head"]),
     r"fw_pre_order\[0\] 'M.block' is not the root module 'M'"),
    (lambda d: d.update(fw_post_order=["M.block.lin", "M.block", "M", "M.head"]),
     r"fw_post_order\[-1\] 'M.head' is not the root module 'M'"),
    (lambda d: d.update(fw_pre_order=["M", "M.block.lin", "M.block", "M.head"]),
     r"modules\[2\] 'M.block.lin' does not lie inside its parent 'M.block'"),
    # siblings in one order in pre-order and the other in post-order: no single forward pass
    (lambda d: d.update(fw_pre_order=["M", "M.head", "M.block", "M.block.lin"]),
     r"fw_pre_order runs 'M.head' before its sibling 'M.block' .* but fw_post_order has 'M.block' first"),
    # a parent link that skips a level would let a module and its real enclosing module both be checkpointed
    (lambda d: (d["modules"][2].update(is_leaf=False),
                d["modules"].append({"fqn": "M.block.lin.x", "parent": "M.block", "is_leaf": True}),
                d.update(fw_pre_order=["M", "M.block", "M.block.lin", "M.block.lin.x", "M.head"],
                         fw_post_order=["M.block.lin.x", "M.block.lin", "M.block", "M.head", "M"])),
     r"modules\[4\]\.parent 'M.block' is not the innermost module enclosing 'M.block.lin.x': 'M.block.lin' is a "
     r"module too"),
    (lambda d: d["modules"][2].update(ops=[]), r"modules\[2\]\.ops: 'M.block.lin' is a leaf module"),
    (lambda d: d["modules"][1]["ops"][0].update(inplace_parent=2),
     r"modules\[1\]\.ops\[0\]\.inplace_parent 2 comes after the op itself"),
    (lambda d: d["modules"][0].update(fw_ms=float("nan")), r"modules\[0\]\.fw_ms: must be a finite number, got nan"),
    (lambda d: d["modules"][1]["ops"][3].update(output_bytes=float("nan")),
     r"modules\[1\]\.ops\[3\]\.output_bytes: must be a finite number, got nan"),
    (lambda d: d["modules"][0].pop("fqn"), r"modules\[0\]\.fqn: field required"),
    (lambda d: d.pop("fw_post_order"), r"fw_post_order: field required"),
    (lambda d: d.update(modules=[], fw_pre_order=[], fw_post_order=[]), r"modules: List should have at least 1 item"),
    (lambda d: d["metadata"].update(batch_size=0), r"metadata\.batch_size: .*\(got 0\)"),
    (lambda d: d["modules"][0].update(param_bytes=True), r"modules\[0\]\.param_bytes: must be a number, got True"),
    (lambda d: d["metadata"].update(tags={"a\udc00": "b"}), r"metadata\.tags\..*must be valid Unicode text, got a lone surrogate"),
    (lambda d: d["metadata"].update(dtype="bf\ud800"), r"metadata\.dtype: .*(unicode|Unicode)"),
    (lambda d: d["modules"][1]["ops"][0].update(runtime_ms="1.0"), r"modules\[1\]\.ops\[0\]\.runtime_ms: must be a number, got '1.0'"),
    (lambda d: d["modules"][1]["ops"][0].update(output_bytes=12.5), r"modules\[1\]\.ops\[0\]\.output_bytes: .*fractional part"),
])
def test_validation_errors_name_field_and_value(edit, match):
    with pytest.raises(StatsError, match=match):
        parse_stats(_broken(edit))


def test_not_an_object():
    with pytest.raises(StatsError, match="must be a JSON object, got list"):
        parse_stats([1, 2])


def test_hash_is_canonical():
    a = parse_stats(small_doc())
    shuffled = json.loads(json.dumps(small_doc(), sort_keys=True))
    assert stats_hash(a) == stats_hash(parse_stats(shuffled))
    other = small_doc()
    other["metadata"]["tags"]["team"] = "y"
    assert stats_hash(parse_stats(other)) != stats_hash(a)


def test_torch_format_converts_what_the_planner_uses():
    raw = json.loads(L4.read_text())
    s = load_stats(L4)
    assert len(s.modules) == len(raw["module_info"]["mod_stats"])
    assert s.fw_pre_order == raw["module_info"]["mod_order"]["fw_pre_order"]
    assert s.fw_post_order == raw["module_info"]["mod_order"]["fw_post_order"]
    for ms in raw["module_info"]["mod_stats"]:
        m = s.module(ms["fqn"])
        assert (m.param_bytes, m.act_saved_bytes, m.act_total_bytes, m.act_grad_bytes, m.grad_total_bytes) == (
            ms["param_per_module"], ms["act_fw_per_module"], ms["act_total"], ms["act_grad_per_module"],
            ms["grad_total"])
        assert (m.fw_ms, m.bw_ms, m.is_leaf) == (ms["fw_runtime_per_module"], ms["bw_runtime_per_module"],
                                                 ms["is_leaf"])
        sac = raw["sac_stats"].get(ms["fqn"])
        if sac is None:
            assert m.ops is None
            continue
        assert [op.name for op in m.ops] == sac["func_names"]
        assert [op.output_bytes for op in m.ops] == sac["memory"]
        assert [op.runtime_ms for op in m.ops] == sac["runtimes"]
        assert [i for i, op in enumerate(m.ops) if op.view_like] == sac["view_like_ops"]
        assert [i for i, op in enumerate(m.ops) if op.random] == sac["rand_ops"]
        assert [i for i, op in enumerate(m.ops) if op.saved_by_autograd] == sac["saved_autograd_ops"]
        assert sorted([i, op.inplace_parent] for i, op in enumerate(m.ops) if op.inplace_parent is not None) == sorted(
            sac["inplace_ops"])
        assert m.op_bytes == ms["sac_memory"]
    # round trip through our own format
    again = Stats.model_validate_json(s.model_dump_json())
    assert stats_hash(again) == stats_hash(s)


def test_torch_format_bad_sac_stats_are_named():
    raw = json.loads(L4.read_text())
    key = next(iter(raw["sac_stats"]))
    bad = copy.deepcopy(raw)
    bad["sac_stats"][key]["inplace_ops"] = [[1, 999]]
    with pytest.raises(StatsError, match=r"inplace_ops\[0\] parent 999 is out of range"):
        parse_stats(bad)
    bad = copy.deepcopy(raw)
    bad["sac_stats"]["Nope"] = raw["sac_stats"][key]
    with pytest.raises(StatsError, match=r"sac_stats\['Nope'\] names no module"):
        parse_stats(bad)


_ATT = "Transformer.layers.0.attention"


def _torch_broken(edit):
    raw = json.loads(L4.read_text())
    edit(raw)
    return raw


@pytest.mark.parametrize("edit,match", [
    (lambda r: r["module_info"].pop("mod_order"), r"^module_info\.mod_order is missing$"),
    (lambda r: r["module_info"]["mod_order"].pop("fw_pre_order"),
     r"module_info\.mod_order\.fw_pre_order must be a list of module fqns, got None"),
    (lambda r: r["module_info"].update(mod_stats={}), r"module_info\.mod_stats must be a list, got \{\}"),
    (lambda r: r.update(sac_stats=[]), r"sac_stats must be an object mapping module fqns to SACStats, got \[\]"),
    (lambda r: r["module_info"]["mod_stats"][3].update(act_total=-5),
     r"module_info\.mod_stats\[3\]\.act_total: .*greater than or equal to 0 \(got -5\)"),
    (lambda r: r["module_info"]["mod_stats"][3].update(fw_runtime_per_module=float("inf")),
     r"module_info\.mod_stats\[3\]\.fw_runtime_per_module: must be a finite number, got inf"),
    (lambda r: r["module_info"]["mod_stats"][3].update(is_leaf="no"),
     r"module_info\.mod_stats\[3\]\.is_leaf must be true or false, got 'no'"),
    (lambda r: r["module_info"]["mod_stats"][4].update(is_leaf=True),
     r"module_info\.mod_stats\[4\]\.is_leaf is true but 'Transformer.layers.0' has submodules"),
    (lambda r: r["module_info"]["mod_stats"][5].update(fqn=r["module_info"]["mod_stats"][4]["fqn"]),
     r"module_info\.mod_stats\[5\]\.fqn 'Transformer.layers.0' duplicates module_info\.mod_stats\[4\]"),
    (lambda r: r["module_info"]["mod_order"]["fw_post_order"].pop(),
     r"module_info\.mod_order\.fw_post_order has 61 entries but there are 62 modules"),
    (lambda r: r["sac_stats"].update({_ATT: [1, 2]}), r"sac_stats\['Transformer.layers.0.attention'\] must be an object"),
    (lambda r: r["sac_stats"][_ATT].pop("func_names"), r"sac_stats\['Transformer.layers.0.attention'\]\.func_names is missing"),
    (lambda r: r["sac_stats"][_ATT].update(func_names=5), r"\.func_names must be a list, got int 5"),
    (lambda r: r["sac_stats"][_ATT].update(runtimes=[1.0]), r"\.runtimes has 1 entries but func_names has 54"),
    (lambda r: r["sac_stats"][_ATT]["runtimes"].__setitem__(2, -1.0),
     r"sac_stats\['Transformer.layers.0.attention'\]\.runtimes\[2\]: .*greater than or equal to 0 \(got -1\.0\)"),
    (lambda r: r["sac_stats"][_ATT]["memory"].__setitem__(2, float("nan")), r"\.memory\[2\]: must be a finite number, got nan"),
    (lambda r: r["sac_stats"][_ATT].update(view_like_ops=[500]), r"\.view_like_ops\[0\] 500 is out of range for 54 ops"),
    (lambda r: r["sac_stats"][_ATT].update(rand_ops=[True]), r"\.rand_ops\[0\] True is not a whole-number op index"),
    (lambda r: r["sac_stats"][_ATT].update(inplace_ops=5), r"\.inplace_ops must be a list, got int 5"),
    (lambda r: r["sac_stats"][_ATT].update(inplace_ops=[[1]]), r"\.inplace_ops\[0\] \[1\] is not an \[op, parent\] pair"),
    (lambda r: r["sac_stats"][_ATT].update(inplace_ops=[[3.7, 1]]), r"\.inplace_ops\[0\] op 3\.7 is not a whole-number op index"),
    (lambda r: r["sac_stats"][_ATT].update(inplace_ops=[[3, 1], [3, 2]]),
     r"\.inplace_ops\[1\] gives op 3 the parent 2, but an earlier entry gave it 1"),
    (lambda r: r["sac_stats"][_ATT].update(inplace_ops=[[0, 3]]), r"\.inplace_ops: op 0's parent 3 comes after the op itself"),
    (lambda r: r["sac_stats"][_ATT].update(force_store_random="yes"), r"\.force_store_random must be true or false, got 'yes'"),
    (lambda r: r["sac_stats"][_ATT].update(func_names="abc"), r"\.func_names must be a list, got str 'abc'"),
    (lambda r: r["sac_stats"][_ATT]["memory"].__setitem__(2, True), r"\.memory\[2\]: must be a number, got True$"),
    (lambda r: [m.pop("act_total") for m in r["module_info"]["mod_stats"]],
     r"module_info\.mod_stats\[0\] \('Transformer'\)\.act_total: field required"),
    (lambda r: r["module_info"]["mod_stats"][2].update(act_total=True), r"mod_stats\[2\]\.act_total: must be a number, got True"),
    (lambda r: r["module_info"]["mod_stats"][0].update(param_per_module="12"),
     r"mod_stats\[0\]\.param_per_module: must be a number, got '12'"),
    (lambda r: r["sac_stats"].update({"Transformer.output": r["sac_stats"][_ATT]}),
     r"sac_stats\['Transformer.output'\]: 'Transformer.output' is a leaf module, .* \(drop this entry\)"),
])
def test_torch_format_errors_name_torch_fields(edit, match):
    with pytest.raises(StatsError, match=match):
        parse_stats(_torch_broken(edit))


@pytest.mark.parametrize("content,match", [
    (None, r"stats file '.*' is a directory"),
    (b"", r"stats file '.*' is empty"),
    (b"\xff\xfe\x00garbage", r"stats file '.*' is not UTF-8 text"),
    (b"{\"module_info\": ", r"stats file '.*' is not valid JSON"),
    (b"[" * 100000, r"stats file '.*' (nests too deeply|is not valid JSON)"),
])
def test_unreadable_files_are_named(tmp_path, content, match):
    path = tmp_path / "stats.json"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    with pytest.raises(StatsError, match=match):
        load_stats(path)
    with pytest.raises(StatsError, match=r"stats file '.*nope.json' does not exist"):
        load_stats(tmp_path / "nope.json")


def test_l12_loads():
    raw = json.loads(L12.read_text())
    s = load_stats(L12)
    assert [m.fqn for m in s.modules] == [ms["fqn"] for ms in raw["module_info"]["mod_stats"]]
    assert s.fw_pre_order == raw["module_info"]["mod_order"]["fw_pre_order"]
    assert {m.fqn for m in s.modules if m.ops} == set(raw["sac_stats"])
    assert s.fw_post_order == raw["module_info"]["mod_order"]["fw_post_order"]


def test_planner_imports_no_service_or_torch():
    import subprocess
    code = ("import sys, planner, planner.cli_plan; "
            "bad = [m for m in ('torch', 'fastapi', 'sqlalchemy') if m in sys.modules]; "
            "sys.exit(1 if bad else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def _sharded(**fields):
    doc = small_doc()
    doc["metadata"]["sharding"] = {"kind": "fsdp2", "world_size": 4, "units": ["M.block", "M"], **fields}
    return doc


def test_sharded_stats_are_per_rank():
    """docs/fsdp.md: per-rank stats are planned as they are, at world size 1 or their own, no other."""
    from planner import baseline_peak_bytes

    plain, sharded = parse_stats(small_doc()), parse_stats(_sharded())
    assert sharded.metadata.sharding.units == ["M.block", "M"]
    one = baseline_peak_bytes(plain)
    assert baseline_peak_bytes(sharded) == baseline_peak_bytes(sharded, world_size=4) == one
    assert baseline_peak_bytes(plain, world_size=4) < one  # unsharded stats are divided
    with pytest.raises(ValueError, match="world_size 2 does not match the stats: .*world size 4"):
        baseline_peak_bytes(sharded, world_size=2)


@pytest.mark.parametrize("fields, match", [
    ({"units": ["M.nope"]}, r"metadata.sharding.units\[0\] 'M.nope' is not a module fqn"),
    ({"units": []}, "units"),
    ({"kind": "fsdp1"}, "kind"),
    ({"world_size": 0}, "world_size"),
    ({"mixed_precision": "fp8"}, "mixed_precision"),
])
def test_sharding_errors_are_named(fields, match):
    with pytest.raises(StatsError, match=match):
        parse_stats(_sharded(**fields))


def _with_calls(counts: dict, calls: int = 3):
    doc = small_doc()
    doc["modules"][1]["calls"] = calls
    doc["timeline"] = [{"phase": "forward", "key": 2, "activation_bytes": 10, **counts}]
    return doc


@pytest.mark.parametrize("counts, match", [
    ({"repeat_calls_discarding": {"M.nope": 1}}, r"timeline\[0\]\.repeat_calls_discarding names 'M.nope'"),
    ({"repeat_calls_in_backward": {"M.block": 3}}, r"repeat_calls_in_backward\['M.block'\] is 3, but the module "
                                                   r"has only 2 calls after its first"),
    ({"repeat_calls_discarding": {"M.block": 0}}, r"repeat_calls_discarding\.M\.block"),
])
def test_per_call_counts_are_checked(counts, match):
    with pytest.raises(StatsError, match=match):
        parse_stats(_with_calls(counts))


def test_per_call_counts_round_trip_and_leave_other_documents_alone():
    doc = _with_calls({"repeat_calls_discarding": {"M.block": 2}})
    s = parse_stats(doc)
    assert parse_stats(json.loads(s.canonical_json())).timeline[0].repeat_calls_discarding == {"M.block": 2}
    # empty counts are not written: a document without them keeps its text, so its hash (the service's identity)
    plain = _with_calls({})
    assert "repeat_calls" not in parse_stats(plain).canonical_json()
    assert stats_hash(parse_stats(plain)) == stats_hash(parse_stats(_with_calls({"repeat_calls_in_backward": {}})))


def _chained(edits: dict):
    doc = small_doc()
    doc["modules"][1].update(calls=3, chained_calls=[0, 400], held_input_bytes=400, held_inputs=[[7, 400]])
    for (i, k), v in edits.items():
        (doc["modules"][i] if k is None else doc["modules"][i]["ops"][k]).update(v)
    return doc


@pytest.mark.parametrize("edits, match", [
    ({(1, None): {"calls": 1}}, r"modules\[1\]\.chained_calls is set but the module has calls 1"),
    ({(1, None): {"chained_calls": [9, 400]}}, r"modules\[1\]\.chained_calls op 9 is out of range for 4 ops"),
    ({(1, None): {"chained_calls": [0, 401]}}, r"modules\[1\]\.chained_calls: 401 bytes is more than "
                                               r"ops\[0\]\.output_bytes 400"),
    ({(1, None): {"chained_calls": [0, -1]}}, r"modules\[1\]\.chained_calls\[1\]: .*\(got -1\)"),
    ({(1, 3): {"held_tensors": [8]}}, r"modules\[1\]\.ops\[3\]\.held_tensors: tensor 8 is in no module's "
                                      r"held_inputs"),
])
def test_held_tensor_links_are_checked(edits, match):
    with pytest.raises(StatsError, match=match):
        parse_stats(_chained(edits))


def test_held_tensor_links_round_trip_and_leave_other_documents_alone():
    s = parse_stats(_chained({(1, 0): {"held_tensors": [7]}}))
    again = parse_stats(json.loads(s.canonical_json()))
    assert again.module("M.block").chained_calls == (0, 400) and again.module("M.block").ops[0].held_tensors == [7]
    # absent, they are not written: older documents keep their text and hash
    assert "held_tensors" not in parse_stats(small_doc()).canonical_json()
    assert "chained_calls" not in parse_stats(small_doc()).canonical_json()


def test_a_plan_is_recognised_where_stats_are_expected():
    # issue 32: a plan document used to give "metadata: field required ... and 366 more"
    stats = load_stats(Path(__file__).resolve().parents[1] / "data" / "torch_format_transformer_L4.json")
    doc = plan(stats, 4).model_dump(mode="json")
    with pytest.raises(StatsError, match=r"^this is a plan \(what sacplan plan --json answers\), not stats"):
        parse_stats(doc)
    with pytest.raises(StatsError, match=r"^this is a list of plans"):
        parse_stats([doc, doc])
