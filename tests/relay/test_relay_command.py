"""``piwf relay`` and ``piwf view --remote`` at the command line, without a relay running.

Usage errors (exit 2) come before anything is imported or bound; a missing ``websockets`` is
exit 1 naming ``pip install 'piwf[relay]'``. The package is hidden from a child interpreter
(``sys.modules['websockets'] = None``), so these run whether or not the extra is installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from piwf.cli.relay import MISSING_WEBSOCKETS
from piwf.client.websocket import MISSING_WEBSOCKETS as MISSING_FOR_CLIENT

WITHOUT_WEBSOCKETS = (
    "import sys; sys.modules['websockets'] = None; from piwf.cli import main; main(sys.argv[1:])"
)


def piwf(
    tmp_path: Path, *args: str, hide_websockets: bool = False, hiding: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``piwf ARGS`` in a new interpreter; ``hiding`` is a ``-c`` program that hides modules
    first (``hide_websockets``: :data:`WITHOUT_WEBSOCKETS`)."""
    if hide_websockets:
        hiding = WITHOUT_WEBSOCKETS
    prefix = ["-c", hiding] if hiding is not None else ["-m", "piwf"]
    return subprocess.run(
        [sys.executable, *prefix, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PIWF_HOME": str(tmp_path / "home")},
    )


@pytest.mark.parametrize(
    "listen",
    ["0.0.0.0:8765", "[::]:8765", "192.0.2.10:8765", "[2001:db8::1]:8765", "nohost.invalid:8765"],
)
def test_a_listen_address_that_is_not_loopback_is_a_usage_error_naming_the_ssh_tunnel(
    tmp_path: Path, listen: str
) -> None:
    result = piwf(tmp_path, "relay", "--listen", listen)
    assert (result.returncode, result.stdout) == (2, "")
    assert "loopback" in result.stderr and "SSH tunnel" in result.stderr, result.stderr
    assert "ssh -L 8765:127.0.0.1:8765 HOST piwf relay --listen 127.0.0.1:8765" in result.stderr
    assert not (tmp_path / "home").exists(), "nothing was started or written"


def test_a_url_given_to_listen_is_a_usage_error_asking_for_host_port(tmp_path: Path) -> None:
    result = piwf(tmp_path, "relay", "--listen", "ws://127.0.0.1:8765")
    assert (result.returncode, result.stdout) == (2, "")
    assert "'ws://127.0.0.1:8765' is a URL; --listen takes HOST:PORT" in result.stderr
    assert "brackets" not in result.stderr, result.stderr


def test_a_refused_listen_address_with_json_is_one_usage_document(tmp_path: Path) -> None:
    result = piwf(tmp_path, "relay", "--listen", "0.0.0.0:8765", "--json")
    assert result.returncode == 2
    document = json.loads(result.stdout)
    assert document["error"]["code"] == "usage"
    assert "SSH tunnel" in document["error"]["message"]


@pytest.mark.parametrize("listen", ["127.0.0.1", "127.0.0.1:http", "::1:8765", "127.0.0.1:70000"])
def test_a_listen_value_that_is_no_host_and_port_is_a_usage_error(
    tmp_path: Path, listen: str
) -> None:
    result = piwf(tmp_path, "relay", "--listen", listen)
    assert result.returncode == 2 and "--listen" in result.stderr, result.stderr


def test_a_listen_value_with_a_user_or_password_is_refused_without_repeating_it(
    tmp_path: Path,
) -> None:
    result = piwf(tmp_path, "relay", "--listen", "me:s3cr3t-token@127.0.0.1:8765", "--json")
    assert result.returncode == 2
    message = json.loads(result.stdout)["error"]["message"]
    assert "user name or password" in message and "HOST:PORT" in message, message
    assert "s3cr3t" not in result.stdout + result.stderr


def test_a_listen_port_out_of_range_says_the_range(tmp_path: Path) -> None:
    result = piwf(tmp_path, "relay", "--listen", "127.0.0.1:99999")
    assert result.returncode == 2
    assert "the port is 0 to 65535 (0 picks a free one)" in result.stderr, result.stderr


@pytest.mark.parametrize("command", ["relay --listen {host}:8765", "view --remote ws://{host}:1"])
def test_a_refused_host_is_shown_cut_and_escaped(tmp_path: Path, command: str) -> None:
    long_host = "h" * 5000 + ".invalid"
    for host in (long_host, "ex\x1b[2Jample.invalid"):
        result = piwf(tmp_path, *command.format(host=host).split(" "))
        assert result.returncode == 2, result.stderr
        assert "\x1b" not in result.stderr and "h" * 101 not in result.stderr, result.stderr[:300]


def test_without_websockets_piwf_relay_exits_1_naming_the_extra(tmp_path: Path) -> None:
    assert MISSING_WEBSOCKETS == "piwf relay needs the relay extra: pip install 'piwf[relay]'"
    plain = piwf(tmp_path, "relay", "--listen", "127.0.0.1:0", hide_websockets=True)
    assert (plain.returncode, plain.stdout, plain.stderr) == (
        1,
        "",
        f"Error: {MISSING_WEBSOCKETS}\n",
    )
    as_json = piwf(tmp_path, "relay", "--listen", "127.0.0.1:0", "--json", hide_websockets=True)
    assert as_json.returncode == 1
    assert json.loads(as_json.stdout) == {
        "error": {"code": "missingExtra", "message": MISSING_WEBSOCKETS}
    }


def test_without_websockets_piwf_view_remote_exits_1_naming_the_extra(tmp_path: Path) -> None:
    pytest.importorskip(
        "textual",
        reason="without Textual, piwf view names the missing view extra before the relay one"
        " (tox -e relay installs both and runs this)",
    )
    result = piwf(tmp_path, "view", "--remote", "ws://127.0.0.1:9", hide_websockets=True)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == f"Error: {MISSING_FOR_CLIENT}\n"
    assert "pip install 'piwf[relay]'" in MISSING_FOR_CLIENT
    as_json = piwf(tmp_path, "view", "--remote", "ws://127.0.0.1:9", "--json", hide_websockets=True)
    assert (as_json.returncode, as_json.stderr) == (1, "")
    assert json.loads(as_json.stdout) == {
        "error": {"code": "missingExtra", "message": MISSING_FOR_CLIENT}
    }


def test_without_either_extra_piwf_view_remote_names_both_in_one_install_line(
    tmp_path: Path,
) -> None:
    hide_both = WITHOUT_WEBSOCKETS.replace("; from", "; sys.modules['textual'] = None; from")
    result = piwf(tmp_path, "view", "--remote", "ws://127.0.0.1:9", "--json", hiding=hide_both)
    assert (result.returncode, result.stderr) == (1, ""), result.stderr
    assert json.loads(result.stdout)["error"] == {
        "code": "missingExtra",
        "message": "piwf view --remote needs the view and relay extras:"
        " pip install 'piwf[view,relay]'",
    }


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("ws://192.0.2.10:8765", "SSH tunnel"),
        ("ws://0.0.0.0:8765", "SSH tunnel"),
        ("wss://127.0.0.1:8765", "not a ws:// URL"),
        ("http://127.0.0.1:8765", "not a ws:// URL"),
        ("ws://127.0.0.1", "not a ws://HOST:PORT URL"),
        ("ws://127.0.0.1:8765/path", "has a path"),
        ("ws://127.0.0.1:0", "not a ws://HOST:PORT URL"),
        ("ws://127.0.0.1:87\t65", "contains a space or control character"),
    ],
)
def test_a_remote_url_that_is_not_a_loopback_ws_url_is_a_usage_error(
    tmp_path: Path, url: str, says: str
) -> None:
    result = piwf(tmp_path, "view", "--remote", url)
    assert result.returncode == 2 and says in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("ws://user:hunter2-secret@127.0.0.1:8765", "'ws://...@127.0.0.1:8765' carries a user"),
        ("ws://hunter2-secret@127.0.0.1:8765", "carries a user name or password"),
        ("ws://127.0.0.1:8765/?token=hunter2-secret", "'ws://127.0.0.1:8765/?...' has a path"),
        ("http://u:hunter2-secret@127.0.0.1:1/#hunter2-secret", "not a ws:// URL"),
        ("ws://[::1:hunter2-secret@x", "the relay URL is not a ws://HOST:PORT URL"),
        ("ws://127.0.0.1:8765/hunter2-secret", "'ws://127.0.0.1:8765/...' has a path"),
        ("ws://[::1]:8765/hunter2-secret", "'ws://[::1]:8765/...' has a path"),
        ("ws://127.0.0.1:87\n65hunter2-secret", "contains a space or control character"),
    ],
)
def test_a_refused_remote_url_is_shown_without_its_credentials_or_query(
    tmp_path: Path, url: str, says: str
) -> None:
    result = piwf(tmp_path, "view", "--remote", url)
    assert result.returncode == 2 and says in result.stderr, result.stderr
    assert "hunter2" not in result.stderr + result.stdout
