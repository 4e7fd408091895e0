"""The server log module on real files: rotation, modes, symlinks, rate limiting, record size."""

from __future__ import annotations

import logging
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from piwf.server.server_log import (
    MAX_RECORD_CHARS,
    BoundedFormatter,
    RateLimitFilter,
    server_log_handler,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def record(
    message: str, *args: object, level: int = logging.WARNING, **extra: object
) -> logging.LogRecord:
    made = logging.LogRecord("piwf.server", level, __file__, 1, message, args, None)
    for key, value in extra.items():
        setattr(made, key, value)
    return made


@pytest.fixture
def logger(tmp_path: Path) -> Iterator[tuple[logging.Logger, Path]]:
    path = tmp_path / "server.log"
    handler = server_log_handler(path, max_bytes=4096)
    log = logging.getLogger(f"piwf.test-server-log.{tmp_path.name}")
    log.handlers[:] = [handler]
    log.propagate = False
    log.setLevel(logging.INFO)
    yield log, path
    handler.close()
    log.handlers[:] = []


def test_the_log_rotates_at_its_size_and_keeps_one_private_backup(
    logger: tuple[logging.Logger, Path],
) -> None:
    log, path = logger
    for number in range(400):  # about 40 KiB of distinct informational lines
        log.info("line %d of a long series of lines", number)
    backup = path.with_name("server.log.1")
    assert sorted(p.name for p in path.parent.iterdir()) == ["server.log", "server.log.1"]
    for file in (path, backup):
        assert file.stat().st_size <= 4096
        assert stat.S_IMODE(file.stat().st_mode) == 0o600
    assert "line 399 of" in path.read_text()


def test_a_wider_existing_log_is_made_private(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    path.write_text("old\n")
    path.chmod(0o644)
    handler = server_log_handler(path)
    handler.close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text() == "old\n", "appended to, never truncated"


def test_a_symlink_at_the_log_path_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("untouched\n")
    path = tmp_path / "server.log"
    path.symlink_to(target)
    with pytest.raises(OSError):
        server_log_handler(path)
    assert target.read_text() == "untouched\n"


def test_repeated_warnings_pass_in_bursts_and_report_what_was_suppressed() -> None:
    clock = Clock()
    limit = RateLimitFilter(window_s=10.0, burst=2, clock=clock)
    passed = [limit.filter(record("accept failed (%s)", n)) for n in range(50)]
    assert passed == [True, True] + [False] * 48
    clock.now += 10.0
    later = record("accept failed (%s)", "again")
    assert limit.filter(later)
    assert later.getMessage() == "accept failed (again) (48 similar suppressed)"
    assert limit.suppressed(("piwf.server", logging.WARNING, "accept failed (%s)")) == 0


def test_each_template_or_rate_key_is_limited_on_its_own() -> None:
    limit = RateLimitFilter(window_s=10.0, burst=1, clock=Clock())
    assert limit.filter(record("first kind %s", 1))
    assert not limit.filter(record("first kind %s", 2))
    assert limit.filter(record("second kind %s", 1))
    assert limit.filter(record("closed %s", "a", level=logging.INFO, rate_key="k1"))
    assert not limit.filter(record("closed %s", "b", level=logging.INFO, rate_key="k1"))
    assert limit.filter(record("closed %s", "c", level=logging.INFO, rate_key="k2"))


def test_informational_lines_without_a_rate_key_are_never_limited() -> None:
    limit = RateLimitFilter(window_s=10.0, burst=1, clock=Clock())
    assert all(
        limit.filter(record("zygote ready: pid %d", n, level=logging.INFO)) for n in range(20)
    )


def test_the_filter_remembers_a_bounded_number_of_keys() -> None:
    clock = Clock()
    limit = RateLimitFilter(window_s=10.0, burst=1, clock=clock, max_keys=8)
    for number in range(1_000):
        assert limit.filter(record("distinct", level=logging.INFO, rate_key=f"key-{number}"))
    assert len(limit._windows) <= 8
    # The newest keys are kept, so their repeats are still limited.
    assert not limit.filter(record("distinct", level=logging.INFO, rate_key="key-999"))


def test_one_record_is_cut_to_its_bound() -> None:
    text = BoundedFormatter().format(record("%s", "x" * (5 * MAX_RECORD_CHARS)))
    assert len(text) < MAX_RECORD_CHARS + 64
    assert text.endswith("more characters]")
