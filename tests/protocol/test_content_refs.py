"""The naming rule the client relies on to resolve references: ``x_ref`` sits next to ``x``."""

from __future__ import annotations

import inspect

import pytest
from pydantic import BaseModel, ValidationError

from piwf.protocol import agent_payloads, payloads, resource_payloads
from piwf.protocol.payloads import REF_SUFFIX, ContentRef


def models() -> list[type[BaseModel]]:
    found = []
    for module in (payloads, agent_payloads, resource_payloads):
        for _, value in inspect.getmembers(module, inspect.isclass):
            if issubclass(value, BaseModel) and value.__module__ == module.__name__:
                found.append(value)
    return found


def test_every_reference_field_names_its_value_field() -> None:
    pairs = []
    for model in models():
        for name, field in model.model_fields.items():
            if field.annotation == ContentRef | None:
                base = name.removesuffix(REF_SUFFIX)
                assert base != name and base in model.model_fields, (model.__name__, name)
                pairs.append(f"{model.__name__}.{name}")
    assert sorted(pairs) == [
        "AgentSubmissionInfo.error_ref",
        "AgentSubmissionInfo.output_ref",
        "AgentSubmissionInfo.value_ref",
        "OpenRequestInfo.content_ref",
        "OpenRequestInfo.latest_rejection_ref",
        "ResolutionInfo.response_ref",
        "ResourceDetail.spec_ref",
        "ResourceDetail.status_ref",
        "RunDetail.error_ref",
        "RunDetail.output_ref",
        "RunWaitReceipt.error_ref",
        "RunWaitReceipt.output_ref",
        "SubmissionInfo.response_ref",
        "SubmissionReceipt.value_ref",
    ]


GOOD = {
    "sha256": "0" * 64,
    "mediaType": "application/json",
    "length": 1,
    "scope": "run",
    "owner": "run-1",
}


def test_a_reference_round_trips() -> None:
    assert ContentRef.model_validate(GOOD).to_wire() == GOOD


@pytest.mark.parametrize(
    "bad",
    [
        {**GOOD, "length": True},
        {**GOOD, "length": "1"},
        {**GOOD, "length": 0},
        {**GOOD, "sha256": "0" * 63},
        {**GOOD, "sha256": "A" * 64},
        {**GOOD, "mediaType": "image/png"},
        {**GOOD, "scope": "session"},
        {**GOOD, "owner": "has space"},
        {**GOOD, "extra": 1},
    ],
)
def test_a_reference_refuses_loose_values(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        ContentRef.model_validate(bad)
