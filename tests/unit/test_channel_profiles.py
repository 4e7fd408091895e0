"""What ``channels.json`` problems read like: the full path of the file, then the first thing
wrong in it, located by its keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from piwf.server.channels.profiles import ChannelConfigError, load_profiles


def problem_with(home: Path, document: str) -> str:
    (home / "channels.json").write_text(document)
    with pytest.raises(ChannelConfigError) as raised:
        load_profiles(home)
    message = str(raised.value)
    prefix = f"{home / 'channels.json'}: "
    assert message.startswith(prefix), message
    return message.removeprefix(prefix)


def test_a_bad_profile_name_is_reported_with_the_names_allowed(tmp_path: Path) -> None:
    document = json.dumps({"profiles": {"Bad Name": {"kind": "telegram"}}})
    assert problem_with(tmp_path, document) == (
        "profiles: profile name 'Bad Name' is not allowed: use 1 to 64 lowercase letters, "
        "digits, - and _, starting with a letter or digit"
    )


def test_a_profiles_own_problem_is_located_and_says_what_is_wanted(tmp_path: Path) -> None:
    profile = {
        "kind": "telegram",
        "apiBaseUrl": "http://example.com",
        "chatId": "1",
        "allowedUserIds": [1],
        "credentialFile": "channels/ops.token",
    }
    assert problem_with(tmp_path, json.dumps({"profiles": {"ops": profile}})) == (
        "profiles.ops.apiBaseUrl: apiBaseUrl must be https (or http on a loopback host)"
    )


def test_a_document_that_is_not_an_object_says_what_it_must_be(tmp_path: Path) -> None:
    assert problem_with(tmp_path, "[]").startswith("the document must be a JSON object")
    assert problem_with(tmp_path, "{not json").startswith("not valid JSON (")
