"""``ServerSettings.from_environment``: every ``PIWF_*`` tunable it reads refuses a value it
cannot use with a message naming the variable and what it takes, never a raw Python error."""

from __future__ import annotations

import inspect
import re

import pytest

from piwf.server import settings
from piwf.server.settings import ServerSettings

#: The numeric variables ``from_environment`` reads, found in its own source.
NUMERIC = sorted(
    set(re.findall(r'_env_(?:int|float)\(\s*"(PIWF_[A-Z_]+)"', inspect.getsource(settings)))
)


def test_the_numeric_variables_are_found() -> None:
    assert {"PIWF_MAX_WORKERS", "PIWF_IDLE_EXIT_S", "PIWF_RETENTION_VACUUM_MIN_BYTES"} <= set(
        NUMERIC
    )


@pytest.mark.parametrize("name", NUMERIC)
@pytest.mark.parametrize("value", ["abc", "-1", "nan", "1e999", "1.5.2"])
def test_an_unusable_number_names_the_variable_and_what_it_takes(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError) as raised:
        ServerSettings.from_environment()
    message = str(raised.value)
    assert message.startswith(f"{name} must be "), message
    assert "integer" in message or "a finite number of seconds, 0 or more" in message
    assert "invalid literal" not in message and "could not convert" not in message


def test_usable_values_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIWF_MAX_WORKERS", "3")
    monkeypatch.setenv("PIWF_SPARE_RUNNERS", "0")
    monkeypatch.setenv("PIWF_IDLE_EXIT_S", "2.5")
    found = ServerSettings.from_environment()
    assert (found.max_workers, found.spare_runners, found.idle_exit_s) == (3, 0, 2.5)
