"""What a user reads when an adapter's Bot API fails (status and server.log).

The adapter reports a change of its API's health (``channel.health``) with the kind of failure
and a short reason that is already safe (the method and the HTTP status or network error; no
credential, request URL or payload); this module turns them into what to read and what to do.
"""

from __future__ import annotations

from piwf.protocol.channel_v1 import ApiProblem

#: What each way an API fails means, as a user reads it.
_MEANINGS: dict[ApiProblem, str] = {
    "unreachable": "the Bot API cannot be reached",
    "credentialRefused": "the API refused the credential",
    "apiError": "the Bot API answers with an error",
    "badReply": "the Bot API answers something that is not a Bot API reply",
}


def degraded_error(problem: ApiProblem, reason: str | None, credential_file: str) -> str:
    """The error of a profile whose API fails with ``problem``: what is wrong, the adapter's
    ``reason``, and what to do (fix the token in ``credential_file``, or wait: nothing is sent
    meanwhile)."""
    error = f"{_MEANINGS[problem]} ({reason or 'no detail'})"
    if problem == "credentialRefused":
        return f"{error}: fix the token in {credential_file}, then run piwf channel reload"
    return f"{error}; decisions wait until it answers again"
