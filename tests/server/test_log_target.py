"""Unit tests of one attempt's bounded log file (:class:`piwf.server.children.capture.LogTarget`):
its head written as it comes, its last bytes held until the attempt ends, the rest counted."""

from __future__ import annotations

from pathlib import Path

from piwf.server.children.capture import LogTarget, head_marker, tail_marker
from piwf.state.execution.attempt_logs import LogCounts


def numbered(count: int) -> list[bytes]:
    """``count`` lines of 10 bytes each: ``0000 line\\n``, ``0001 line\\n`` …"""
    return [f"{n:04d} line\n".encode() for n in range(count)]


def test_a_chatty_attempt_keeps_its_first_and_last_lines_and_counts_the_rest(
    tmp_path: Path,
) -> None:
    lines = numbered(100)
    target = LogTarget(tmp_path / "a.log", cap=300, tail=100, label="a test log")
    for line in lines:
        target.write("stdout", line)
    # While it runs, the file holds the head and the marker; the tail is held.
    assert (tmp_path / "a.log").read_bytes() == b"".join(lines[:20]) + head_marker(200, 100)
    assert target.counts == LogCounts(stdout=1000, stderr=0, kept=300, dropped=700)

    target.flush_tail()
    target.flush_tail()  # a second flush writes nothing more

    assert (tmp_path / "a.log").read_bytes() == (
        b"".join(lines[:20]) + head_marker(200, 100) + tail_marker(700, 100) + b"".join(lines[90:])
    )
    counts = target.counts
    assert counts == LogCounts(stdout=1000, stderr=0, kept=300, dropped=700)
    assert counts.kept + counts.dropped == counts.stdout + counts.stderr


def test_output_just_past_the_head_is_kept_whole_with_no_count_line(tmp_path: Path) -> None:
    lines = numbered(25)
    target = LogTarget(tmp_path / "a.log", cap=300, tail=100, label="a test log")
    for line in lines:
        target.write("stderr", line)
    target.flush_tail()

    kept = b"".join(lines[:20]) + head_marker(200, 100) + b"".join(lines[20:])
    assert (tmp_path / "a.log").read_bytes() == kept
    assert target.counts == LogCounts(stdout=0, stderr=250, kept=250, dropped=0)


def test_one_write_larger_than_the_cap_keeps_its_own_head_and_tail(tmp_path: Path) -> None:
    data = bytes(range(256)) * 4  # 1,024 bytes in one read
    target = LogTarget(tmp_path / "a.log", cap=300, tail=100, label="a test log")
    target.write("stdout", data)
    target.flush_tail()

    expected = data[:200] + head_marker(200, 100) + tail_marker(724, 100) + data[-100:]
    assert (tmp_path / "a.log").read_bytes() == expected
    assert target.counts == LogCounts(stdout=1024, stderr=0, kept=300, dropped=724)


def test_a_resumed_attempt_past_its_head_grows_by_at_most_its_tail(tmp_path: Path) -> None:
    path = tmp_path / "a.log"
    first = LogTarget(path, cap=300, tail=100, label="a test log")
    for line in numbered(100):
        first.write("stdout", line)
    first.flush_tail()
    size = path.stat().st_size

    # The same attempt again (a resumed agent turn), from the counts its row stored.
    again = LogTarget(path, cap=300, tail=100, label="a test log", counts=first.counts)
    resumed = [f"{n:04d} more\n".encode() for n in range(50)]
    for line in resumed:
        again.write("stdout", line)
    again.flush_tail()

    assert path.read_bytes()[size:] == tail_marker(400, 100) + b"".join(resumed[40:])
    assert again.counts == LogCounts(stdout=1500, stderr=0, kept=400, dropped=1100)


def test_a_tail_that_starts_inside_a_line_starts_at_the_next_one(tmp_path: Path) -> None:
    lines = [f"{n:04d} {'z' * 24}\n".encode() for n in range(40)]  # 30 bytes each
    target = LogTarget(tmp_path / "a.log", cap=300, tail=100, label="a test log")
    for line in lines:
        target.write("stdout", line)
    target.flush_tail()

    # The last 100 bytes start 20 bytes into line 36; the tail starts with line 37.
    head = b"".join(lines)[:200]
    expected = head + head_marker(200, 100) + tail_marker(910, 90) + b"".join(lines[37:])
    assert (tmp_path / "a.log").read_bytes() == expected
    assert target.counts == LogCounts(stdout=1200, stderr=0, kept=290, dropped=910)
