"""Unit tests of piwf/client/loopback.py: which hosts count as loopback-only."""

from __future__ import annotations

import socket

import pytest

from piwf.client import loopback
from piwf.client.loopback import NotLoopbackError, loopback_addresses, parse_listen_address


@pytest.mark.parametrize(
    ("host", "addresses"),
    [("127.0.0.1", ("127.0.0.1",)), ("127.8.9.10", ("127.8.9.10",)), ("::1", ("::1",))],
)
def test_loopback_literals_are_accepted(host: str, addresses: tuple[str, ...]) -> None:
    assert loopback_addresses(host) == addresses


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.5", "10.0.0.1", "2001:db8::1", ""])
def test_other_literals_are_refused(host: str) -> None:
    with pytest.raises(NotLoopbackError):
        loopback_addresses(host)


def test_a_name_must_resolve_to_loopback_addresses_only(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = {
        "loop.test": ["127.0.0.1", "::1", "127.0.0.1"],
        "mixed.test": ["127.0.0.1", "192.168.1.5"],
    }

    def resolve(host: str, port: object, type: int = 0) -> list[tuple[object, ...]]:
        if host not in answers:
            raise socket.gaierror(socket.EAI_NONAME, "not known")
        return [(0, type, 0, "", (address, 0)) for address in answers[host]]

    monkeypatch.setattr(loopback.socket, "getaddrinfo", resolve)
    assert loopback_addresses("loop.test") == ("127.0.0.1", "::1")
    with pytest.raises(NotLoopbackError, match="resolves to 192.168.1.5"):
        loopback_addresses("mixed.test")
    with pytest.raises(NotLoopbackError, match="does not resolve"):
        loopback_addresses("gone.test")


def test_parse_listen_address() -> None:
    assert parse_listen_address("127.0.0.1:8765") == (("127.0.0.1",), 8765)
    assert parse_listen_address("[::1]:0") == (("::1",), 0)
    for text in ("127.0.0.1", ":8765", "127.0.0.1:x", "::1:8765", "127.0.0.1:65536"):
        with pytest.raises(ValueError, match="HOST:PORT|brackets|0 to 65535"):
            parse_listen_address(text)
    with pytest.raises(NotLoopbackError):
        parse_listen_address("0.0.0.0:8765")
