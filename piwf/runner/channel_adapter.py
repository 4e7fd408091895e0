"""The channel adapter child: one Telegram profile, transport only.

Started by the server like every child (:mod:`piwf.runner.bootstrap`), speaking
``piwf.channel.v1`` (:mod:`piwf.protocol.channel_v1`) over its channel::

    receive launch (profile, allowed identities, the one credential, the update offset)
    -> channel.ready -> two duties until the server goes away:
       main thread   channel.present -> sendMessage | editMessageText -> channel.settle
       poll thread   getUpdates(offset) long poll -> channel.answer per update -> response
                     -> answerCallbackQuery (the server's notice) -> offset + 1;
                     channel.health with the first poll's outcome (a short poll), when a
                     poll fails after one that did not (or fails differently: another kind
                     or another reason), and when one succeeds again after failing (polls
                     are short while the API fails, so its return is seen at once)

It never opens SQLite, never loads workflow code and never changes run state: the server
checks every answer and settles decisions. Only the Bot API over ``urllib`` (standard library)
with the configured base URL. The credential lives in memory only; every error text that leaves
this process has it replaced. An update from an identity that is not allowed is relayed without
its button data (the server records the refusal; the answer never leaves the adapter).

A send whose outcome is unknown (a timeout, a reset or a server error after the request left)
settles ``indeterminate``: the server marks it ambiguous and never sends it again by itself.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import queue
import sys
import threading
import traceback
import urllib.error
import urllib.request
from multiprocessing.connection import Connection
from typing import Any

from pydantic import ValidationError

from piwf import faults
from piwf.config import MAX_FRAME_BYTES
from piwf.errors import PiwfError
from piwf.protocol.channel_v1 import (
    AnswerFrame,
    ApiProblem,
    HealthFrame,
    LaunchFrame,
    MessageRef,
    PresentFrame,
    PresentRequest,
    ReadyFrame,
    ResponseFrame,
    SettleFrame,
    Update,
    parse_server_frame,
)
from piwf.runner.entry import EXIT_OK, EXIT_PROTOCOL, name_process
from piwf.runner.lifeline import Lifeline

#: The adapter's exit code when its poll thread failed in a way no check expected.
EXIT_POLL_FAILED = 5

#: How long the poll thread waits for the server's answer to one update.
_RESPONSE_TIMEOUT_S = 30.0
#: The back-off between failed polls (waited on the stop event, so a stop ends it at once).
_POLL_BACKOFF_S = 1.0


class BotApiError(Exception):
    """A Bot API call failed; ``definite`` when the request provably did not take effect,
    ``problem`` the kind of failure (the message is safe: no credential, URL or payload)."""

    def __init__(self, message: str, *, definite: bool, problem: ApiProblem) -> None:
        super().__init__(message)
        self.definite = definite
        self.problem = problem


class TelegramAdapter:
    """One launched adapter: its fence values, the Bot API, and the two duties."""

    def __init__(self, connection: Connection, launch: LaunchFrame) -> None:
        self.connection = connection
        self.launch = launch
        self.profile = launch.channel
        self._credential = launch.credential
        self.allowed = {str(identity) for identity in self.profile.allowed_identities}
        self.revision = launch.expected_revision
        self.offset = launch.offset
        self.sequence = 0
        self.stopping = threading.Event()
        self.responses: queue.Queue[ResponseFrame] = queue.Queue()
        self._send_lock = threading.Lock()
        #: The API's health as last reported to the server: (problem, reason) while it fails,
        #: ``_ANSWERS`` while it answers, ``_UNCHECKED`` until the first poll, whose outcome is
        #: always reported (the server sends nothing through an adapter before its API answered
        #: once).
        self._reported: tuple[ApiProblem | None, str | None] = _UNCHECKED

    # -- the protocol -------------------------------------------------------------------------

    def run(self) -> int:
        """Serve until the server's end closes; return the exit code."""
        self._send(ReadyFrame, attempt_id="ready", expected_revision=self.revision)
        poller = threading.Thread(target=self._poll_forever, name="piwf-channel-poll", daemon=True)
        poller.start()
        try:
            while True:
                try:
                    raw = self.connection.recv_bytes(maxlength=MAX_FRAME_BYTES)
                except (EOFError, OSError):
                    return EXIT_OK  # the server is gone: nothing left to report to
                try:
                    frame = parse_server_frame(raw)
                except (PiwfError, ValidationError):
                    return EXIT_PROTOCOL
                if frame.adapter_epoch != self.launch.adapter_epoch:
                    return EXIT_PROTOCOL
                if isinstance(frame, PresentFrame):
                    self._present(frame)
                elif isinstance(frame, ResponseFrame):
                    self.responses.put(frame)
        finally:
            self.stopping.set()

    def _send(self, model: type[Any], **fields: Any) -> int:
        with self._send_lock:
            self.sequence += 1
            frame = model(
                adapter_epoch=self.launch.adapter_epoch,
                profile=self.launch.profile,
                sequence=self.sequence,
                **fields,
            )
            self.connection.send_bytes(frame.encode())
            return self.sequence

    # -- presenting ---------------------------------------------------------------------------

    def _present(self, frame: PresentFrame) -> None:
        request = frame.request
        outcome, result, error = "applied", None, None
        try:
            if request.method == "sendMessage":
                sent = self.call("sendMessage", self._send_body(request))
                result = MessageRef(chat_id=sent["chat"]["id"], message_id=sent["message_id"])
            else:
                self.call("editMessageText", self._edit_body(request))
                result = request.message_ref
        except BotApiError as failure:
            outcome = "rejected" if failure.definite else "indeterminate"
            error = str(failure)[:1000]
        except (KeyError, TypeError, ValueError) as failure:
            outcome, error = "indeterminate", self._safe(f"unexpected reply: {failure}")[:1000]
        self._send(
            SettleFrame,
            attempt_id=frame.attempt_id,
            expected_revision=frame.expected_revision,
            outcome=outcome,
            result=result,
            error=error,
        )

    def _send_body(self, request: PresentRequest) -> dict[str, Any]:
        body: dict[str, Any] = {"chat_id": self.profile.chat_id, "text": request.text}
        if request.buttons:
            rows = [[{"text": b.text, "callback_data": b.data}] for b in request.buttons]
            body["reply_markup"] = {"inline_keyboard": rows}
        return body

    def _edit_body(self, request: PresentRequest) -> dict[str, Any]:
        ref = request.message_ref
        if ref is None:
            raise BotApiError(
                "an edit needs the message it edits", definite=True, problem="apiError"
            )
        return {
            "chat_id": ref.chat_id,
            "message_id": ref.message_id,
            "text": request.text,
            "reply_markup": {"inline_keyboard": []},
        }

    # -- polling ------------------------------------------------------------------------------

    def _poll_forever(self) -> None:
        """Poll until stopped. An error no check expected ends the whole adapter (its traceback
        in the adapter's log): a poll thread that died quietly would leave the profile shown
        ``ready`` while no answer is ever picked up again; an ended adapter is shown
        ``exited`` and started again with a back-off."""
        try:
            while not self.stopping.is_set():
                if not self._poll_once():
                    self.stopping.wait(_POLL_BACKOFF_S)
        except (OSError, EOFError):
            return  # the pipe is gone: the main thread ends the adapter
        except Exception:
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(EXIT_POLL_FAILED)

    def _poll_once(self) -> bool:
        """One ``getUpdates`` and the relay of what it brought; False when the API failed.

        The API's health is reported on each change only: the first poll's outcome, a failure
        after a success (or a different failure: another kind or another reason), and a
        success after a failure. Raises ``OSError`` or ``EOFError`` when the pipe to the server
        is gone.
        """
        # Short polls until the API is known to answer: a long one would keep a recovered
        # API looking failed (and its old reason shown) for the whole poll.
        checking = self._reported != _ANSWERS
        try:
            updates = self.call(
                "getUpdates",
                {
                    "offset": self.offset,
                    # The first poll, and each while the API fails, does not wait for
                    # updates: the server learns at once whether the API answers.
                    "timeout": 0 if checking else self.profile.poll_timeout_s,
                    "allowed_updates": ["callback_query", "message"],
                },
                timeout_s=self.profile.poll_timeout_s + self.profile.request_timeout_s,
            )
            faults.point("channel.after_poll")
            for update in updates:
                if self.stopping.is_set():
                    return True
                self._relay(update)
        except BotApiError as failure:
            self._report_health(failure.problem, str(failure))
            return False
        except (ArithmeticError, KeyError, TypeError, ValueError):  # an update_id of 1e400, say
            self._report_health("badReply", "getUpdates: an update of an unexpected shape")
            return False
        self._report_health(None, None)
        return True

    def _report_health(self, problem: ApiProblem | None, reason: str | None) -> None:
        health = (problem, None if reason is None else self._safe(reason)[:300])
        if health == self._reported:
            return
        self._send(
            HealthFrame,
            attempt_id="health",
            expected_revision=self.revision,
            problem=health[0],
            reason=health[1],
        )
        self._reported = health

    def _relay(self, raw: dict[str, Any]) -> None:
        update_id = int(raw["update_id"])  # none to pass over: the poll's reply is bad
        update = self._update_of(update_id, raw.get("callback_query"))
        sequence = self._send(
            AnswerFrame,
            attempt_id=f"update-{update_id}",
            expected_revision=self.revision,
            update=update,
        )
        try:
            response = self._response_to(sequence)
        except queue.Empty:
            return  # unanswered: the next poll relays it again (the cursor makes that safe)
        self.revision = response.revision
        if response.outcome != "accepted":
            self.stopping.wait(_POLL_BACKOFF_S)
            return  # not applied: relayed again at the fresh revision
        self.offset = update_id + 1
        if update.callback_id is not None:
            notice = response.notice or "Received"
            # Only the spinner on the person's button; the answer itself is durable already.
            with contextlib.suppress(BotApiError):
                self.call(
                    "answerCallbackQuery", {"callback_query_id": update.callback_id, "text": notice}
                )

    def _update_of(self, update_id: int, callback: object) -> Update:
        """The update to relay: a button press with its sender and (when allowed) its data, or
        one without content. A press of an unexpected shape (a sender that is no object, data
        that is no short string) is relayed without content, and said in this adapter's log:
        the server records it ``ignored`` and the cursor moves past it, where refusing it
        would stop every later update behind it until the API dropped it (a day)."""
        if not isinstance(callback, dict):
            return Update(update_id=update_id)
        try:
            sent_by = callback.get("from", {})
            if not isinstance(sent_by, dict):
                raise TypeError("its sender is not an object")
            sender = str(sent_by.get("id", ""))
            allowed = sender in self.allowed
            return Update(
                update_id=update_id,
                identity=f"telegram:{sender}" if sender else None,
                data=callback.get("data") if allowed else None,
                callback_id=str(callback.get("id")) if callback.get("id") else None,
                allowed=allowed,
            )
        except (TypeError, ValueError) as error:  # pydantic's ValidationError is a ValueError
            reason = self._safe(str(error).splitlines()[0] if str(error) else type(error).__name__)
            print(
                f"update {update_id}: a button press of an unexpected shape, passed over"
                f" ({reason[:200]})",
                file=sys.stderr,
                flush=True,
            )
            return Update(update_id=update_id)

    def _response_to(self, sequence: int) -> ResponseFrame:
        while True:
            response = self.responses.get(timeout=_RESPONSE_TIMEOUT_S)
            if response.reply_to == sequence:
                return response

    # -- the Bot API --------------------------------------------------------------------------

    def call(self, method: str, body: dict[str, Any], *, timeout_s: float | None = None) -> Any:
        """POST one Bot API method; return its ``result`` or raise :class:`BotApiError`."""
        url = f"{self.profile.api_base_url.rstrip('/')}/bot{self._credential}/{method}"
        # The server accepts only an https (or loopback http) base URL for a profile.
        request = urllib.request.Request(  # noqa: S310
            url,
            data=json.dumps(body).encode("utf-8"),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        timeout = timeout_s if timeout_s is not None else self.profile.request_timeout_s
        try:
            with urllib.request.urlopen(request, timeout=timeout) as reply:  # noqa: S310
                document = json.loads(reply.read(MAX_FRAME_BYTES))
        except urllib.error.HTTPError as error:
            # A 4xx other than 429 is the API refusing the request: it did not take effect.
            definite = 400 <= error.code < 500 and error.code != 429
            problem: ApiProblem = "credentialRefused" if error.code == 401 else "apiError"
            said = _description(error)
            raise BotApiError(
                self._safe(f"{method}: HTTP {error.code}{said}"), definite=definite, problem=problem
            ) from None
        except urllib.error.URLError as error:
            refused = isinstance(error.reason, ConnectionRefusedError)
            message = self._safe(f"{method}: {error.reason}")
            raise BotApiError(message, definite=refused, problem="unreachable") from None
        except (TimeoutError, OSError) as error:
            message = self._safe(f"{method}: {error}")
            raise BotApiError(message, definite=False, problem="unreachable") from None
        except (ValueError, http.client.HTTPException) as error:
            # Not JSON, or a broken HTTP reply (a bad status line, a body cut short).
            message = self._safe(f"{method}: {type(error).__name__} {error}".rstrip())
            raise BotApiError(message, definite=False, problem="badReply") from None
        if not isinstance(document, dict) or not isinstance(document.get("ok"), bool):
            # JSON, but no Bot API reply (a proxy's or another service's page): whether a
            # send took effect is unknown.
            message = self._safe(f"{method}: a reply without the Bot API's ok field")
            raise BotApiError(message, definite=False, problem="badReply")
        if document["ok"] is not True:
            description = document.get("description")
            said = description[:_DESCRIPTION_CHARS] if isinstance(description, str) else ""
            raise BotApiError(
                self._safe(f"{method}: {said or 'not ok'}"), definite=True, problem="apiError"
            )
        return document.get("result")

    def _safe(self, text: str) -> str:
        """``text`` with the credential replaced (an error may quote the request URL) and
        every character that is not printable shown as its Python escape: what an API
        answers (a description) must not forge a line of status or the server log, nor drive
        a terminal."""
        text = text.replace(self._credential, "<credential>")
        return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


#: The API's health before the first poll (see ``TelegramAdapter._reported``).
_UNCHECKED: tuple[ApiProblem | None, str | None] = (None, "unchecked")
#: The API's health while it answers.
_ANSWERS: tuple[ApiProblem | None, str | None] = (None, None)

#: How much of an API's error body is read, and of its description kept.
_ERROR_BODY_BYTES = 4096
_DESCRIPTION_CHARS = 200


def _description(error: urllib.error.HTTPError) -> str:
    """``": <the API's description>"`` of a refusal (``Bad Request: chat not found``), cut
    short; nothing when its body is not a Bot API error document."""
    try:
        document = json.loads(error.read(_ERROR_BODY_BYTES))
    except (OSError, ValueError, http.client.HTTPException):
        return ""
    description = document.get("description") if isinstance(document, dict) else None
    if not isinstance(description, str) or not description:
        return ""
    return f": {description[:_DESCRIPTION_CHARS]}"


def run_child(connection: Connection, life: Lifeline) -> int:
    """Entry of the channel adapter child (see :mod:`piwf.runner.entry`)."""
    try:
        frame = parse_server_frame(connection.recv_bytes(maxlength=MAX_FRAME_BYTES))
    except ValidationError:
        return EXIT_PROTOCOL
    if not isinstance(frame, LaunchFrame):
        return EXIT_PROTOCOL
    name_process(f"piwf channel {frame.profile} e{frame.adapter_epoch}")
    return TelegramAdapter(connection, frame).run()
