"""The published wire contract: the committed schemas are the models', the vectors decode as they say,
and what gym-failures writes validates against the schemas."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from gym_failures.collection import CollectionConfig, collect
from gym_failures.wire_contract import main, schemas
from tests import contract_vectors

CONTRACT = Path(__file__).resolve().parents[1] / "contract"


def _schema(name: str) -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((CONTRACT / "schemas" / f"{name}.schema.json").read_text())
    return schema


def _validator(name: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(_schema(name))


def _vectors(name: str) -> list[dict[str, Any]]:
    vectors: list[dict[str, Any]] = json.loads((CONTRACT / "vectors" / f"{name}.json").read_text())
    return vectors


def test_the_committed_schemas_are_generated_from_the_models(tmp_path: Path) -> None:
    assert main([str(tmp_path)]) == 0
    for name in schemas():
        written = (tmp_path / f"{name}.schema.json").read_text()
        assert written == (CONTRACT / "schemas" / f"{name}.schema.json").read_text(), (
            f"{name}: run `python -m gym_failures.wire_contract contract/schemas`"
        )


@pytest.mark.parametrize("name", sorted(schemas()))
def test_every_schema_is_a_valid_json_schema(name: str) -> None:
    jsonschema.Draft202012Validator.check_schema(_schema(name))


def test_the_committed_vectors_are_current() -> None:
    built = contract_vectors.build()
    for name, entries in built.items():
        assert _vectors(name) == json.loads(json.dumps(entries)), (
            f"{name}: run `python -m tests.contract_vectors`"
        )


@pytest.mark.parametrize("entry", _vectors("header"), ids=lambda entry: entry["name"])
def test_a_header_vector_decodes_as_it_says(entry: dict[str, Any]) -> None:
    assert contract_vectors.decode_header(entry["input"]) == entry["expected"]


@pytest.mark.parametrize("entry", _vectors("stream_field"), ids=lambda entry: entry["name"])
def test_a_stream_vector_decodes_as_it_says(entry: dict[str, Any]) -> None:
    assert contract_vectors.decode_stream(entry["input"]) == entry["expected"]


@pytest.mark.parametrize("entry", _vectors("rows"), ids=lambda entry: entry["name"])
def test_a_row_vector_reads_as_it_says(entry: dict[str, Any]) -> None:
    assert contract_vectors.read_row(entry["input"]) == entry["expected"]


@pytest.mark.parametrize("entry", _vectors("rollout_failure"), ids=lambda entry: entry["name"])
def test_a_record_vector_reads_as_it_says(entry: dict[str, Any]) -> None:
    assert contract_vectors.read_record(entry["input"]) == entry["expected"]
    if "record" in entry["expected"]:
        _validator("rollout_failure").validate(entry["expected"]["record"])


@pytest.mark.parametrize("entry", _vectors("header"), ids=lambda entry: entry["name"])
def test_the_header_schema_accepts_every_value_a_reader_decodes(entry: dict[str, Any]) -> None:
    expected = entry["expected"]
    if expected is None or (
        expected["omitted"] and not expected["events"] and entry["input"] != '{"omitted":true}'
    ):
        return  # absent, or refused: see the next test
    _validator("failure_report_header").validate(json.loads(entry["input"]))


@pytest.mark.parametrize(
    "name",
    [
        "JSON that is no object",
        "a reason of 2001 characters",
        "an event id of 129 characters",
        "HTTP status 600",
        "an unknown field",
    ],
)
def test_the_header_schema_refuses_what_a_reader_refuses(name: str) -> None:
    (entry,) = [entry for entry in _vectors("header") if entry["name"] == name]
    assert entry["expected"] == {"events": {}, "omitted": True}
    assert not _validator("failure_report_header").is_valid(json.loads(entry["input"]))


def test_the_stream_schema_accepts_a_decoded_report() -> None:
    (entry,) = [entry for entry in _vectors("stream_field") if entry["name"] == "a report"]
    _validator("failure_report_stream_field").validate(entry["input"])
    assert not _validator("failure_report_stream_field").is_valid({"nemo_gym_failure_report": "text"})


async def test_every_row_the_collector_writes_validates_against_its_schema(
    tmp_path: Path, agent_url: str
) -> None:
    tasks = [
        {"mode": "ok"},
        {"mode": "retry_then_ok"},
        {"mode": "terminal"},
        {"mode": "always_fail"},
        {"mode": "raise"},
        {"mode": "error_body", "body": "bad gateway"},
        {"mode": "masked"},
    ]
    input_path = tmp_path / "tasks.jsonl"
    input_path.write_text("".join(json.dumps(task) + "\n" for task in tasks))
    config = CollectionConfig(
        input_path=input_path,
        output_path=tmp_path / "out" / "rollouts.jsonl",
        agent_url=agent_url,
        max_attempts=2,
    )
    await collect(config)
    successes = [json.loads(line) for line in config.output_path.read_text().splitlines()]
    failures = [json.loads(line) for line in config.failures_path.read_text().splitlines()]
    assert len(successes) == 3
    assert len(failures) >= 5
    for row in successes:
        _validator("success_row").validate(row)
    for row in failures:
        _validator("failure_row").validate(row)
