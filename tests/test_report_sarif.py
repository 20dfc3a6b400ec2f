"""`traceql check --format sarif`: valid SARIF 2.1.0 against the official OASIS schema, with rule docs and locations.

The schema (tests/data/sarif/, see its manifest.json) is checked with jsonschema where it is installed and always
with the small draft-04 validator below, which covers every keyword the SARIF schema uses.
"""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest
from _report_helpers import ANY_RUN_DIRS, RUN_DIRS, checked, need

from traceql.report import sarif

SCHEMA = orjson.loads((Path(__file__).parent / "data" / "sarif" / "sarif-schema-2.1.0.json").read_bytes())


# --- a draft-04 validator for the keywords the SARIF schema uses -----------------------------------------------

_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def schema_errors(inst, schema, root=SCHEMA, path="$") -> list[str]:
    if "$ref" in schema:
        ref = schema["$ref"]
        assert ref.startswith("#/"), ref
        target = root
        for part in ref[2:].split("/"):
            target = target[part]
        return schema_errors(inst, target, root, path)
    errs: list[str] = []
    t = schema.get("type")
    if t is not None:
        types = t if isinstance(t, list) else [t]
        if not any(_TYPES[x](inst) for x in types):
            return [f"{path}: {type(inst).__name__} is not {types}"]
    if "enum" in schema and inst not in schema["enum"]:
        errs.append(f"{path}: {inst!r} not in {schema['enum']}")
    if isinstance(inst, (int, float)) and not isinstance(inst, bool):
        if "minimum" in schema and inst < schema["minimum"]:
            errs.append(f"{path}: {inst} < minimum {schema['minimum']}")
        if "maximum" in schema and inst > schema["maximum"]:
            errs.append(f"{path}: {inst} > maximum {schema['maximum']}")
    if isinstance(inst, str) and "pattern" in schema and not re.search(schema["pattern"], inst):
        errs.append(f"{path}: {inst!r} does not match {schema['pattern']}")
    if isinstance(inst, dict):
        for req in schema.get("required", []):
            if req not in inst:
                errs.append(f"{path}: missing required {req!r}")
        props = schema.get("properties", {})
        addl = schema.get("additionalProperties", True)
        for k, v in inst.items():
            if k in props:
                errs += schema_errors(v, props[k], root, f"{path}.{k}")
            elif addl is False:
                errs.append(f"{path}: unexpected property {k!r}")
            elif isinstance(addl, dict):
                errs += schema_errors(v, addl, root, f"{path}.{k}")
    if isinstance(inst, list):
        if len(inst) < schema.get("minItems", 0):
            errs.append(f"{path}: fewer than {schema['minItems']} items")
        if schema.get("uniqueItems") and len({orjson.dumps(x, option=orjson.OPT_SORT_KEYS) for x in inst}) != len(inst):
            errs.append(f"{path}: items not unique")
        if isinstance(schema.get("items"), dict):
            for i, v in enumerate(inst):
                errs += schema_errors(v, schema["items"], root, f"{path}[{i}]")
    for sub in schema.get("allOf", []):
        errs += schema_errors(inst, sub, root, path)
    if "anyOf" in schema and not any(not schema_errors(inst, s, root, path) for s in schema["anyOf"]):
        errs.append(f"{path}: matches none of anyOf")
    if "oneOf" in schema and sum(not schema_errors(inst, s, root, path) for s in schema["oneOf"]) != 1:
        errs.append(f"{path}: does not match exactly one of oneOf")
    return errs


def assert_valid(doc: dict) -> None:
    errs = schema_errors(doc, SCHEMA)
    assert not errs, "\n".join(errs[:20])
    try:
        import jsonschema
    except ImportError:
        return
    jsonschema.Draft4Validator(SCHEMA).validate(doc)


# --- the validator itself must reject what the schema forbids ----------------------------------------------------

def test_validator_rejects_invalid_sarif():
    assert schema_errors({"version": "2.1.0", "runs": []}, SCHEMA) == []
    assert schema_errors({"version": "2.0.0", "runs": []}, SCHEMA)
    bad_level = {"version": "2.1.0", "runs": [{"tool": {"driver": {"name": "x"}}, "results": [{"message": {"text": "m"}, "level": "warn"}]}]}
    assert any("level" in e for e in schema_errors(bad_level, SCHEMA))
    no_driver = {"version": "2.1.0", "runs": [{"tool": {}}]}
    assert any("driver" in e for e in schema_errors(no_driver, SCHEMA))


# --- traceql's SARIF ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module", params=ANY_RUN_DIRS)
def result(request):
    """The committed sample run (always) and the corpus's trace_filter (where present)."""
    return checked(str(need(request.param)))


def test_sarif_validates_against_official_schema(result):
    doc = orjson.loads(sarif.render(result))
    assert result.findings, "the corpus run should produce findings to check"
    assert_valid(doc)
    assert doc["version"] == "2.1.0"


def test_rules_carry_docs_and_levels(result):
    doc = sarif.to_sarif(result)
    rules = {r["id"]: r for r in doc["runs"][0]["tool"]["driver"]["rules"]}
    assert set(rules) == {r.rule.id for r in result.results}
    level = {"error": "error", "warning": "warning", "info": "note"}
    for rr in result.results:
        d = rules[rr.rule.id]
        assert d["shortDescription"]["text"] == rr.rule.summary
        assert d["fullDescription"]["text"] == " ".join(str(rr.rule.docs["why"]).split())
        assert d["defaultConfiguration"]["level"] == level[rr.rule.severity]
        for ref in rr.rule.docs.get("references", []):
            assert ref in d["help"]["markdown"]
        assert "How to fix it" in d["help"]["markdown"]


def test_results_locate_file_rank_and_step(result):
    doc = sarif.to_sarif(result)
    run = doc["runs"][0]
    assert len(run["results"]) == len(result.findings)
    rules = run["tool"]["driver"]["rules"]
    base = result.run.path
    rank_of = {s.path.resolve(): s.rank for s in result.run.sources}
    for f, r in zip(result.findings, run["results"], strict=True):
        assert rules[r["ruleIndex"]]["id"] == f.rule == r["ruleId"]
        assert r["partialFingerprints"][sarif.FINGERPRINT_KEY] == f.fingerprint
        loc = r["locations"][0]
        uri = loc["physicalLocation"]["artifactLocation"]["uri"]
        assert not uri.startswith("/") and (base / uri).is_file()
        name = loc["logicalLocations"][0]["name"]
        if f.ranks:
            assert rank_of[(base / uri).resolve()] == f.ranks[0]  # the result names its own rank's file
            assert name.startswith(f"rank{','.join(map(str, f.ranks))}")
        else:  # a finding about the run (a missing rank): the file is the evidence, the logical name says 'run'
            assert (base / uri).resolve() in rank_of and not name.startswith("rank")
        if f.step is not None:
            assert f"/step{f.step}" in name
    assert run["originalUriBaseIds"]["RUNDIR"]["uri"].startswith("file://")


def test_logical_name_shapes():
    assert sarif.logical_name([3], 12) == "rank3/step12"
    assert sarif.logical_name([0, 2], None, {"stream": 7}) == "rank0,2/stream7"
    assert sarif.logical_name([], None) == "run"


@pytest.mark.parametrize("run_dir", RUN_DIRS)
def test_sarif_via_cli(run_dir, tmp_path):
    from click.testing import CliRunner

    from traceql.cli import main

    out = tmp_path / "r.sarif"
    res = CliRunner().invoke(main, ["check", str(need(run_dir)), "--format", "sarif", "--out", str(out), "--quiet", "--no-cache"])
    assert res.exit_code in (0, 1), res.output
    doc = orjson.loads(out.read_bytes())
    assert_valid(doc)
    assert doc["runs"][0]["results"]
