"""CLI tests share the client tests' short state home and their guard against real servers."""

from __future__ import annotations

from tests.client.conftest import no_server_start, short_home

__all__ = ["no_server_start", "short_home"]
