"""Accept backoff and the choice of the connection to shed, on real socket pairs."""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from piwf.server.connections import SHED_MIN_IDLE_S, ClientConnection, Deadlines, longest_idle
from piwf.server.listener import AcceptBackoff, accept_failure, has_pending_connection


def test_the_accept_pause_doubles_to_its_cap_and_starts_over_after_a_success() -> None:
    backoff = AcceptBackoff(first_s=0.05, max_s=2.0)
    pauses = [backoff.failed() for _ in range(9)]
    assert pauses == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0]
    assert backoff.failures == 9
    assert backoff.failed(freed=True) == 0.05, "a freed descriptor is tried again soon"
    assert backoff.failed() == 2.0, "without growing the pause"
    backoff.succeeded()
    assert backoff.failures == 0
    assert backoff.failed() == 0.05


@pytest.mark.parametrize(
    ("number", "kind"),
    [
        (errno.EMFILE, "exhausted"),
        (errno.ENFILE, "exhausted"),
        (errno.ENOBUFS, "exhausted"),
        (errno.ENOMEM, "exhausted"),
        (errno.ECONNABORTED, "peer"),
        (errno.EPROTO, "peer"),
        (errno.EINVAL, "other"),
    ],
)
def test_accept_failures_are_classified(number: int, kind: str) -> None:
    assert accept_failure(OSError(number, "x")) == kind


def test_a_pending_connection_is_seen_without_accepting_it(tmp_path: Path) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        path = f"{tmp_path}/s"
        listener.bind(path)
        listener.listen()
        assert not has_pending_connection(listener)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(path)
            assert has_pending_connection(listener)
            accepted, _ = listener.accept()
            accepted.close()
        assert not has_pending_connection(listener)


@pytest.fixture
def pairs() -> Iterator[list[tuple[socket.socket, socket.socket]]]:
    made = [socket.socketpair() for _ in range(3)]
    yield made
    for left, right in made:
        left.close()
        right.close()


def connections(
    pairs: list[tuple[socket.socket, socket.socket]], accepted_at: list[float]
) -> list[ClientConnection]:
    return [
        ClientConnection(left, f"connection-{n}", 1, now=at)
        for n, ((left, _), at) in enumerate(zip(pairs, accepted_at, strict=True))
    ]


def test_the_connection_idle_longest_is_shed_once_idle_long_enough(
    pairs: list[tuple[socket.socket, socket.socket]],
) -> None:
    oldest, middle, newest = connections(pairs, [10.0, 20.0, 30.0])
    candidates = [newest, oldest, middle]
    assert longest_idle(candidates, now=10.0 + SHED_MIN_IDLE_S / 2) is None
    assert longest_idle(candidates, now=40.0) is oldest
    oldest.received(10, now=35.0)
    assert longest_idle(candidates, now=40.0) is middle


@pytest.mark.parametrize("busy", ["inflight", "output", "partial frame", "backlog", "closing"])
def test_a_busy_connection_is_never_shed(
    pairs: list[tuple[socket.socket, socket.socket]], busy: str
) -> None:
    oldest, newest = connections(pairs[:2], [10.0, 30.0])
    if busy == "inflight":
        oldest.inflight = 1
    elif busy == "output":
        oldest.output += b"answer"
    elif busy == "partial frame":
        oldest.decoder.feed(b'{"half":')
    elif busy == "backlog":
        oldest.backlog.append(b"{}")
    else:
        oldest.closing = True
    assert not oldest.idle
    assert longest_idle([oldest, newest], now=40.0) is newest


def test_deadlines_name_why_a_connection_is_closed(
    pairs: list[tuple[socket.socket, socket.socket]],
) -> None:
    deadlines = Deadlines(frame_s=10.0, first_frame_s=5.0, output_stall_s=20.0)
    (silent,) = connections(pairs[:1], [0.0])
    assert silent.overdue(4.0, deadlines) is None
    assert silent.overdue(6.0, deadlines) == "it sent nothing after connecting"
    silent.received(1, now=6.0)
    assert silent.overdue(100.0, deadlines) is None, "an idle talker is never closed for it"
    silent.output += b"x"
    silent.output_progress_at = 100.0
    assert silent.overdue(110.0, deadlines) is None
    assert silent.overdue(121.0, deadlines) == "it stopped reading its responses"
    off = Deadlines(frame_s=10.0)
    assert silent.overdue(1_000.0, off) is None
    assert off.check_interval_s == 0.25
    assert Deadlines(frame_s=0.02).check_interval_s == 0.01
