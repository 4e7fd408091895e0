"""``ServerSettings.from_environment``: every ``PIWF_*`` tunable it reads refuses a value it
cannot use with a message naming the variable and what it takes, never a raw Python error."""

from __future__ import annotations

import inspect
import re

import pytest

from piwf.canonical import MAX_SAFE_INTEGER
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
@pytest.mark.parametrize(
    "value", ["abc", "-1", "nan", "1e999", "1.5.2", "99999999999999999999", "1e300"]
)
def test_an_unusable_number_names_the_variable_and_what_it_takes(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError) as raised:
        ServerSettings.from_environment()
    message = str(raised.value)
    assert message.startswith(f"{name} must be "), message
    assert "integer" in message or "a finite number of seconds, " in message
    assert "and at most " in message
    assert "invalid literal" not in message and "could not convert" not in message


def test_usable_values_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIWF_MAX_WORKERS", "3")
    monkeypatch.setenv("PIWF_SPARE_RUNNERS", "0")
    monkeypatch.setenv("PIWF_IDLE_EXIT_S", "2.5")
    found = ServerSettings.from_environment()
    assert (found.max_workers, found.spare_runners, found.idle_exit_s) == (3, 0, 2.5)


#: Intervals and deadlines that 0 would turn into a busy loop or an instant failure.
NOT_ZERO = [
    "PIWF_SERVER_RENEW_S",
    "PIWF_FRAME_DEADLINE_S",
    "PIWF_RUN_RENEW_S",
    "PIWF_CLAIM_POLL_S",
    "PIWF_RUNNER_READY_TIMEOUT_S",
    "PIWF_RESOLVER_TIMEOUT_S",
    "PIWF_VALIDATION_TIMEOUT_S",
]


@pytest.mark.parametrize("name", NOT_ZERO)
def test_an_interval_or_deadline_of_zero_is_refused(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setenv(name, "0")
    with pytest.raises(
        ValueError, match=f"^{name} must be a finite number of seconds, more than 0"
    ):
        ServerSettings.from_environment()


@pytest.mark.parametrize("name", ["PIWF_IDLE_EXIT_S", "PIWF_QUICK_CHECK_S", "PIWF_SPARE_RUNNERS"])
def test_zero_still_means_off_where_it_is_documented_so(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setenv(name, "0")
    ServerSettings.from_environment()


def test_the_largest_accepted_values_still_fit_what_carries_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PIWF_RETENTION_DAYS", str(settings.MAX_RETENTION_DAYS))
    monkeypatch.setenv("PIWF_RUN_LEASE_MS", str(settings.MAX_SETTING_MILLISECONDS))
    monkeypatch.setenv("PIWF_VALIDATION_TIMEOUT_S", str(settings.MAX_SETTING_SECONDS))
    found = ServerSettings.from_environment()
    # Epoch milliseconds plus a lease, minus the retention days, and the validation frame's
    # timeout in milliseconds all stay exact integers.
    assert found.run_lease_ms + 10**13 <= MAX_SAFE_INTEGER
    assert found.retention_days * 86_400_000 <= MAX_SAFE_INTEGER
    assert int(found.validation_timeout_s * 1000) <= MAX_SAFE_INTEGER


@pytest.mark.parametrize("value", ["1_000", "\u0663", "1\u0660"])
def test_a_number_python_alone_would_read_is_refused(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    """``int`` and ``float`` take digit separators and non-ASCII digits: ``1_000`` started a
    server with 1000 workers."""
    monkeypatch.setenv("PIWF_MAX_WORKERS", value)
    with pytest.raises(ValueError, match="^PIWF_MAX_WORKERS must be a positive integer"):
        ServerSettings.from_environment()
    monkeypatch.delenv("PIWF_MAX_WORKERS")
    monkeypatch.setenv("PIWF_IDLE_EXIT_S", value)
    with pytest.raises(ValueError, match="^PIWF_IDLE_EXIT_S must be a finite number"):
        ServerSettings.from_environment()


def test_spare_runners_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every spare is a process started at once when the server starts."""
    monkeypatch.setenv("PIWF_SPARE_RUNNERS", str(settings.MAX_SPARE_RUNNERS))
    assert ServerSettings.from_environment().spare_runners == settings.MAX_SPARE_RUNNERS
    monkeypatch.setenv("PIWF_SPARE_RUNNERS", str(settings.MAX_SPARE_RUNNERS + 1))
    with pytest.raises(ValueError, match="^PIWF_SPARE_RUNNERS must be .* at most 32, "):
        ServerSettings.from_environment()


LEASES = [
    ("PIWF_RUN_LEASE_MS", "PIWF_RUN_RENEW_S"),
    ("PIWF_SERVER_LEASE_MS", "PIWF_SERVER_RENEW_S"),
]


@pytest.mark.parametrize(("lease", "renew"), LEASES)
@pytest.mark.parametrize(
    ("lease_ms", "renew_s"), [("1", None), ("1000", None), ("19999", None), ("1000", "0.6")]
)
def test_a_lease_shorter_than_two_renewals_is_refused(
    monkeypatch: pytest.MonkeyPatch,
    lease: str,
    renew: str,
    lease_ms: str,
    renew_s: str | None,
) -> None:
    """A run lease that lapsed between two renewals (default every 10 s) lost every claim of
    a running run: the run was taken up again and again, its effect applied on every take. A
    server lease of 1 ms lost the server its epoch at its first command: it stopped."""
    monkeypatch.setenv(lease, lease_ms)
    if renew_s is not None:
        monkeypatch.setenv(renew, renew_s)
    with pytest.raises(ValueError) as raised:
        ServerSettings.from_environment()
    message = str(raised.value)
    assert message.startswith(f"{lease} ({lease_ms}) must be at least twice {renew} "), message


@pytest.mark.parametrize(("lease", "renew"), LEASES)
def test_a_lease_of_two_renewals_or_more_is_taken(
    monkeypatch: pytest.MonkeyPatch, lease: str, renew: str
) -> None:
    monkeypatch.setenv(lease, "1000")
    monkeypatch.setenv(renew, "0.5")
    ServerSettings.from_environment()
    monkeypatch.delenv(lease)
    monkeypatch.setenv(renew, "40")
    with pytest.raises(ValueError, match="at least 80000 ms"):
        ServerSettings.from_environment()  # the default lease is 30 s


@pytest.mark.parametrize("value", ["", "   "])
def test_an_empty_or_blank_agent_command_counts_as_unset(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("PIWF_AGENT_COMMAND", value)
    assert ServerSettings.from_environment().agent_command is None
