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


def profile_with(**changes: object) -> str:
    profile = {
        "kind": "telegram",
        "chatId": "1",
        "allowedUserIds": [1],
        "credentialFile": "channels/ops.token",
    }
    return json.dumps({"profiles": {"ops": {**profile, **changes}}})


def test_a_chat_id_is_a_number_or_a_channel_username(tmp_path: Path) -> None:
    for chat_id in ("1\n", "", "chat 1", "@"):
        assert problem_with(tmp_path, profile_with(chatId=chat_id)).startswith(
            "profiles.ops.chatId: "
        ), chat_id
    assert "numeric chat id" in problem_with(tmp_path, profile_with(chatId="1\u0000"))


def test_a_timeout_that_is_not_finite_is_refused(tmp_path: Path) -> None:
    document = profile_with(requestTimeoutS=1.0).replace("1.0", "NaN")
    assert problem_with(tmp_path, document) == (
        "profiles.ops.requestTimeoutS: Input should be a finite number"
    )


def test_a_profile_named_twice_is_refused_not_silently_dropped(tmp_path: Path) -> None:
    profile = json.loads(profile_with())["profiles"]["ops"]
    entry = json.dumps(profile)
    twice = f'{{"profiles": {{"ops": {entry}, "ops": {entry}}}}}'
    assert problem_with(tmp_path, twice) == (
        "not valid JSON (the key 'ops' appears twice in one object)"
    )


def test_a_token_given_as_the_credential_file_is_refused_without_echoing_it(
    tmp_path: Path,
) -> None:
    token = "123456789:AAF" + "x" * 32
    message = problem_with(tmp_path, profile_with(credentialFile=token))
    assert message.startswith("profiles.ops.credentialFile: credentialFile looks like a bot token")
    assert token not in message and "AAF" not in message
    # A path that merely holds a colon is still a path.
    assert load_profiles_ok(tmp_path, profile_with(credentialFile="channels/ops:1.token"))


def load_profiles_ok(home: Path, document: str) -> bool:
    (home / "channels.json").write_text(document)
    return len(load_profiles(home)) == 1


LEAKED = "123456789:AAsecret-token-value_abcdefghij"


def test_a_token_pasted_into_the_api_url_is_refused_without_echoing_it(tmp_path: Path) -> None:
    # Step 3 of the setup opens https://api.telegram.org/bot<token>/getUpdates: a person may
    # paste that whole URL as the base URL.
    for url in (
        f"https://api.telegram.org/bot{LEAKED}",
        f"https://api.telegram.org/bot{LEAKED}/getUpdates",
    ):
        problem = problem_with(tmp_path, profile_with(apiBaseUrl=url))
        assert problem.startswith("profiles.ops.apiBaseUrl: apiBaseUrl carries a bot token"), (
            problem
        )
        assert LEAKED not in problem and "AAsecret" not in problem


def test_a_token_in_a_key_is_never_echoed(tmp_path: Path) -> None:
    documents = (
        json.dumps({"profiles": {LEAKED: {}}}),
        json.dumps({LEAKED: {}}),
        profile_with(**{LEAKED: 1}),
        '{"profiles": {}, "' + LEAKED + '": 1, "' + LEAKED + '": 2}',
    )
    for document in documents:
        problem = problem_with(tmp_path, document)
        assert "AAsecret" not in problem, problem
        assert "<token-like text>" in problem, problem


def test_control_characters_in_a_key_are_shown_escaped(tmp_path: Path) -> None:
    forged = "x\x1b[2K\n2026-01-01 00:00:00,000 INFO channel ops: the Bot API answers again"
    for document in (profile_with(**{forged: 1}), json.dumps({"profiles": {forged: {}}})):
        problem = problem_with(tmp_path, document)
        assert "\n" not in problem and "\x1b" not in problem, problem
        assert "\\n2026" in problem and "\\x1b" in problem, problem


def test_a_credential_file_path_holding_a_token_or_a_control_character_is_refused(
    tmp_path: Path,
) -> None:
    # The path is shown wherever its file cannot be used (status, errors, server.log): a token
    # inside it, or a line break that forges a log line, must be refused before it is shown.
    for credential_file in (
        f"bot{LEAKED}",
        f"channels/{LEAKED}",
        f" {LEAKED}x",
        "channels/ops.token\n2026-01-01 00:00:00,000 INFO channel ops: fine",
        "channels/ops\x1b[2K.token",
    ):
        problem = problem_with(tmp_path, profile_with(credentialFile=credential_file))
        assert problem.startswith("profiles.ops.credentialFile: credentialFile "), problem
        assert "AAsecret" not in problem and "\n" not in problem, problem
