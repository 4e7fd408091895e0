"""Unit tests of piwf/relay/peer.py: the uid owning a loopback peer, from /proc/net/tcp."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

from piwf.relay.peer import peer_uid

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="/proc/net/tcp is Linux's"
)


@pytest.mark.parametrize(
    ("family", "host"), [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")]
)
def test_a_real_loopback_connection_is_owned_by_this_user(family: int, host: str) -> None:
    with socket.socket(family) as listener:
        try:
            listener.bind((host, 0))
        except OSError:
            pytest.skip(f"no {host} here")
        listener.listen()
        with socket.socket(family) as client:
            client.connect(listener.getsockname()[:2])
            accepted, _ = listener.accept()
            with accepted:
                peer, relay = accepted.getpeername()[:2], accepted.getsockname()[:2]
                assert peer_uid(peer, relay) == os.geteuid()
                # The relay's own row (the other direction) is not the peer.
                assert peer_uid(relay, ("127.0.0.9", 1)) is None


def test_a_fed_table_is_read_by_address_port_and_state(tmp_path: Path) -> None:
    table = tmp_path / "tcp"
    table.write_text(
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid\n"
        "   0: 0100007F:223D 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0\n"
        "   1: 0100007F:A2F4 0100007F:223D 06 00000000:00000000 00:00000000 00000000     0\n"
        "   2: 0100007F:A2F4 0100007F:223D 01 00000000:00000000 00:00000000 00000000  1000\n"
        "   3: 0100007F:223D 0100007F:A2F4 01 00000000:00000000 00:00000000 00000000     0\n"
    )
    if sys.byteorder != "little":
        pytest.skip("the table above is written in little-endian words")
    assert peer_uid(("127.0.0.1", 41716), ("127.0.0.1", 8765), [table]) == 1000
    assert peer_uid(("127.0.0.1", 41717), ("127.0.0.1", 8765), [table]) is None
    assert peer_uid(("127.0.0.1", 41716), ("127.0.0.1", 8765), [tmp_path / "missing"]) is None
