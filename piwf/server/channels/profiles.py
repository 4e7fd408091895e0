"""The channel profiles of ``$PIWF_HOME/channels.json`` and their credential files.

::

    {"profiles": {"ops": {"kind": "telegram",
                          "apiBaseUrl": "https://api.telegram.org",
                          "chatId": "123456789",
                          "allowedUserIds": [123456789],
                          "credentialFile": "channels/ops.token"}}}

A profile names its credential file, never the credential: the file must lie inside the state
home, be a regular file (no symlink) of this user with mode ``0600`` (no bits for group or
others); anything looser is refused with the ``chmod`` that fixes it. The credential is read
only to launch the adapter and handed to it over its private pipe; it is never stored, logged,
shown in status or put in an error. The API base URL is ``https``, or ``http`` on a loopback
host (a local test double).
"""

from __future__ import annotations

import errno
import hashlib
import ipaddress
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from piwf import canonical
from piwf.config import CHANNELS_FILE_NAME
from piwf.errors import PiwfError

PROFILE_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
#: Telegram user ids are positive and have at most 52 significant bits; the bound keeps every
#: id exact in JSON (a larger number would fail later, in the canonical encoding).
MAX_USER_ID = 2**53 - 1
#: A numeric chat id (negative for groups) or a public channel's ``@username``.
_CHAT_ID = re.compile(r"-?[0-9]{1,20}|@[A-Za-z0-9_]{1,64}")
#: The shape of a Telegram bot token (``<bot id>:<secret>``): what a ``credentialFile`` must
#: never be, since a path is shown in errors and the token itself never is.
_TOKEN_SHAPE = re.compile(r"[0-9]{5,}:[A-Za-z0-9_-]{20,}")
#: The largest configuration file and credential file read.
_MAX_CONFIG_BYTES = 256 * 1024
_MAX_CREDENTIAL_BYTES = 512


class ChannelConfigError(PiwfError):
    """The channel configuration or a credential file cannot be used (the server stays up)."""

    code = "channelConfig"


class TelegramProfileConfig(BaseModel):
    """One Telegram profile as configured."""

    # Strict: a JSON string, float or boolean is not silently taken for a number (``true`` is
    # not user id 1); the camelCase names of docs/CHANNELS.md are the only field names (no
    # ``populate_by_name``).
    model_config = ConfigDict(
        extra="forbid", frozen=True, strict=True, alias_generator=to_camel, defer_build=True
    )

    kind: Literal["telegram"]
    api_base_url: str = Field(default="https://api.telegram.org", max_length=2048)
    chat_id: str = Field(min_length=1, max_length=128)
    allowed_user_ids: list[Annotated[int, Field(ge=1, le=MAX_USER_ID)]] = Field(
        min_length=1, max_length=256
    )
    credential_file: str = Field(min_length=1, max_length=4096)
    poll_timeout_s: int = Field(default=25, ge=0, le=60)
    request_timeout_s: float = Field(default=30.0, gt=0, le=300, allow_inf_nan=False)

    @field_validator("api_base_url")
    @classmethod
    def _safe_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if "@" in parts.netloc or parts.query or parts.fragment:
            # Refused before it can reach an error text or a log line (a password, a token).
            raise ValueError(
                "apiBaseUrl takes no user name, password, query or fragment: give the base "
                "URL only (the token lives in credentialFile)"
            )
        if _TOKEN_SHAPE.search(value):
            # The setup's getUpdates URL pasted whole: refused without being echoed.
            raise ValueError(
                "apiBaseUrl carries a bot token (as in .../bot<token>): give the base URL only, "
                "as https://api.telegram.org (the token lives in credentialFile)"
            )
        try:
            parts.port  # noqa: B018 - a port that is not a number raises here, not in the adapter
        except ValueError:
            raise ValueError("apiBaseUrl has a port that is not a number from 0 to 65535") from None
        if parts.scheme == "https" and parts.hostname:
            return value
        if parts.scheme == "http" and parts.hostname and _is_loopback(parts.hostname):
            return value
        raise ValueError("apiBaseUrl must be https (or http on a loopback host)")

    @field_validator("chat_id", mode="before")
    @classmethod
    def _chat_id_text(cls, value: object) -> object:
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value

    @field_validator("credential_file")
    @classmethod
    def _a_path_not_a_token(cls, value: str) -> str:
        # The path is shown in status, errors and server.log (a file it cannot open), so any
        # token-shaped part of it ("bot<token>", "channels/<token>") and any control character
        # is refused here, before it can be shown.
        if _TOKEN_SHAPE.search(value):
            raise ValueError(
                "credentialFile looks like a bot token itself: put the token in a file inside "
                "the state home (mode 0600) and name that file here"
            )
        if not value.isprintable():
            raise ValueError(
                "credentialFile holds a character that is not printable (a line break, a tab, "
                "an escape): name the token file by its plain path"
            )
        return value

    @field_validator("chat_id")
    @classmethod
    def _chat_id_form(cls, value: str) -> str:
        if not _CHAT_ID.fullmatch(value):
            raise ValueError(
                "chatId must be a numeric chat id (negative for a group, as in -1001234567890) "
                "or a public channel's @username"
            )
        return value


class ChannelsFile(BaseModel):
    """The whole configuration document."""

    # Built on first use (``defer_build``), like ``TelegramProfileConfig``: only a home with
    # a channels file is ever read with them.
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    profiles: dict[str, TelegramProfileConfig] = Field(default_factory=dict, max_length=32)

    @field_validator("profiles", mode="before")
    @classmethod
    def _names(cls, value: object) -> object:
        # Before the profiles themselves: a bad name is the first thing to fix, and a profile
        # under it would otherwise be reported as if the name were fine.
        if isinstance(value, dict):
            for name in value:
                if not PROFILE_NAME.fullmatch(name):
                    raise ValueError(
                        f"profile name {shown(name)[:64]!r} is not allowed: use 1 to 64 lowercase "
                        "letters, digits, - and _, starting with a letter or digit"
                    )
        return value


@dataclass(frozen=True)
class Profile:
    """One loaded profile; ``digest`` changes when the profile or its credential changes (kept
    in memory only, so a reload can tell which adapters to restart)."""

    name: str
    config: TelegramProfileConfig
    digest: str

    def identity_allowed(self, identity: str | None) -> bool:
        """Whether ``identity`` (``telegram:<user id>``) may answer on this profile."""
        return identity in {f"telegram:{user}" for user in self.config.allowed_user_ids}


def config_path(home: Path) -> Path:
    """Where the channel profiles are configured."""
    return home / CHANNELS_FILE_NAME


def load_profiles(home: Path) -> list[Profile]:
    """Read and check the configuration; no file means no channels.

    Raises :class:`ChannelConfigError` naming what is wrong (never a credential): unreadable or
    malformed JSON, an unknown field, a bad URL, or an unusable credential file.
    """
    path = config_path(home)
    try:
        with open(path, "rb") as handle:
            raw = handle.read(_MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        return []
    except OSError as error:
        raise ChannelConfigError(f"{path}: cannot be read ({error.strerror})") from None
    if len(raw) > _MAX_CONFIG_BYTES:
        raise ChannelConfigError(f"{path}: larger than {_MAX_CONFIG_BYTES} bytes")
    try:
        document = ChannelsFile.model_validate(json.loads(raw, object_pairs_hook=_unique_keys))
    except (ValueError, ValidationError) as error:
        raise ChannelConfigError(f"{path}: {_first_problem(error)}") from None
    profiles = []
    for name, profile in sorted(document.profiles.items()):
        try:
            credential = read_credential(home, profile.credential_file)
        except ChannelConfigError as error:
            credential = f"unusable: {error}"  # its launch fails and says why; others run
        digest = hashlib.sha256(
            canonical.encode([profile.model_dump(mode="json"), credential])
        ).hexdigest()
        profiles.append(Profile(name=name, config=profile, digest=digest))
    return profiles


def read_credential(home: Path, configured: str) -> str:
    """The credential in ``configured`` (relative to the state home, or absolute inside it).

    Raises :class:`ChannelConfigError` for a file outside the home, a symlink, not a regular
    file, another owner, or a mode with any group or other bit.
    """
    path = Path(configured) if Path(configured).is_absolute() else home / configured
    # Normalised without following links (".." cannot leave the home; a link is refused).
    resolved = Path(os.path.normpath(path.absolute()))
    root = Path(os.path.normpath(home.absolute()))
    if root not in resolved.parents:
        raise ChannelConfigError(f"credential file {configured}: must be inside the state home")
    try:
        # O_NONBLOCK: a FIFO put in its place must not hang the server in open().
        descriptor = os.open(resolved, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise ChannelConfigError(
                f"credential file {configured}: is a symbolic link; put the token in a regular "
                "file inside the state home and name that file"
            ) from None
        raise ChannelConfigError(
            f"credential file {configured}: cannot be opened ({error.strerror})"
        ) from None
    # Checked on the descriptor before any read: a directory or a FIFO is never read.
    info = os.fstat(descriptor)
    if not stat.S_ISREG(info.st_mode):
        os.close(descriptor)
        raise ChannelConfigError(
            f"credential file {configured}: not a regular file; name the token file itself"
        )
    with os.fdopen(descriptor, "rb") as handle:
        if info.st_uid != os.getuid():
            raise ChannelConfigError(f"credential file {configured}: belongs to another user")
        if info.st_mode & 0o077:
            raise ChannelConfigError(
                f"credential file {configured}: mode {stat.S_IMODE(info.st_mode):04o} is too "
                f"open; run: chmod 600 {resolved}"
            )
        content = handle.read(_MAX_CREDENTIAL_BYTES + 1)
    text = content.decode("utf-8", errors="replace").strip()
    if not text or len(content) > _MAX_CREDENTIAL_BYTES or any(c.isspace() for c in text):
        raise ChannelConfigError(f"credential file {configured}: not one token on one line")
    return text


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """A JSON object whose keys are unique: a repeated key (two profiles of one name) would
    otherwise keep only its last value without a word."""
    document: dict[str, object] = {}
    for key, value in pairs:
        if key in document:
            raise ValueError(f"the key {shown(key)[:64]!r} appears twice in one object")
        document[key] = value
    return document


def shown(text: str) -> str:
    """``text`` from the file (a key, a profile name) as an error may show it: what looks like
    a bot token replaced, every character that is not printable (a line break, a terminal
    escape) as its Python escape, so it can neither leak a credential nor forge a log line."""
    text = _TOKEN_SHAPE.sub("<token-like text>", text)
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _first_problem(error: Exception) -> str:
    """The first thing wrong with the document, located by its path of keys."""
    if not isinstance(error, ValidationError):
        return f"not valid JSON ({error})"
    first = error.errors(include_url=False, include_input=False)[0]
    if not first["loc"]:
        return 'the document must be a JSON object: {"profiles": {"<name>": {...}}}'
    where = ".".join(shown(str(part))[:64] for part in first["loc"])
    # A validator's own message, without pydantic's "Value error, " in front of it.
    cause = first.get("ctx", {}).get("error") if first["type"] == "value_error" else None
    return f"{where}: {cause if cause is not None else first['msg']}"
