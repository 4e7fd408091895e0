"""A local fake of the Telegram Bot API for channel tests (loopback HTTP, standard library).

Implements ``sendMessage``, ``editMessageText``, ``getUpdates`` (long polling with ``offset``:
updates below the offset are confirmed and dropped, as Telegram does) and
``answerCallbackQuery``, under ``/bot<token>/<method>``. It records every call (method, token,
body), lets a test inject a button press from any user id, and can be told to hang the next
``sendMessage`` (it has then been received and recorded, but never answered: an in-flight send),
to refuse every token (HTTP 401, as Telegram answers a wrong one), to answer every
``getUpdates`` with a given document (:attr:`FakeBotApi.poll_answer`), to hold long polls as long
as asked (:attr:`FakeBotApi.longest_wait_s`, 1 s by default), or to go offline and come back on
the same port (:meth:`FakeBotApi.go_offline`, :meth:`FakeBotApi.go_online`).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Call:
    method: str
    token: str
    body: dict[str, Any]


@dataclass
class FakeBotApi:
    """The fake's state; ``url`` is its base URL once started."""

    chat_id: int = 5150
    calls: list[Call] = field(default_factory=list)
    updates: list[dict[str, Any]] = field(default_factory=list)
    hang_sends: bool = False
    refuse_credential: bool = False
    #: When set, every getUpdates is answered (HTTP 200) with this document instead.
    poll_answer: dict[str, Any] | None = None
    #: When set, every sendMessage is refused (HTTP 400) with this document (recorded first).
    send_refusal: dict[str, Any] | None = None
    #: How many requests were refused with HTTP 401.
    refusals: int = 0
    #: How many getUpdates polls were answered (not recorded as calls).
    polls: int = 0
    #: The longest a getUpdates long poll waits for an update (its ``timeout``, bounded).
    longest_wait_s: float = 1.0
    lock: threading.Condition = field(default_factory=threading.Condition)
    released: threading.Event = field(default_factory=threading.Event)
    _server: ThreadingHTTPServer | None = None
    _address: tuple[str, int] = ("127.0.0.1", 0)
    _handler: type[BaseHTTPRequestHandler] | None = None
    _next_update: int = 1000
    _next_message: int = 1

    @property
    def url(self) -> str:
        host, port = self._address
        return f"http://{host}:{port}"

    def start(self) -> FakeBotApi:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                _, _, rest = self.path.partition("/bot")
                token, _, method = rest.partition("/")
                if fake.refuse_credential:
                    with fake.lock:
                        fake.refusals += 1
                    refusal = {"ok": False, "error_code": 401, "description": "Unauthorized"}
                    self._answer(401, refusal)
                    return
                if method == "getUpdates" and fake.poll_answer is not None:
                    self._answer(200, fake.poll_answer)
                    return
                result = fake.handle(method, token, body)
                if method == "sendMessage" and fake.send_refusal is not None:
                    self._answer(400, fake.send_refusal)
                    return
                if result is _HANG:
                    fake.released.wait(120)
                    return
                self._answer(200, {"ok": True, "result": result})

            def _answer(self, status: int, document: dict[str, Any]) -> None:
                data = json.dumps(document).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the adapter was killed while it waited

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._handler = Handler
        self.go_online()
        return self

    def go_online(self) -> None:
        """Listen (again, on the same port once it had one)."""
        assert self._handler is not None, "start() first"
        self._server = ThreadingHTTPServer(self._address, self._handler)
        self._server.daemon_threads = True
        self._address = ("127.0.0.1", int(self._server.server_address[1]))
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def go_offline(self) -> None:
        """Stop listening: a connection to :attr:`url` is refused until :meth:`go_online`."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def stop(self) -> None:
        self.released.set()
        with self.lock:
            self.lock.notify_all()
        self.go_offline()

    # -- the API ------------------------------------------------------------------------------

    def handle(self, method: str, token: str, body: dict[str, Any]) -> Any:
        with self.lock:
            if method != "getUpdates":
                self.calls.append(Call(method, token, body))
                self.lock.notify_all()
            if method == "sendMessage":
                if self.hang_sends:
                    return _HANG
                self._next_message += 1
                return {
                    "message_id": self._next_message,
                    "chat": {"id": self.chat_id},
                    "text": body.get("text"),
                }
            if method == "editMessageText":
                return {"message_id": body.get("message_id"), "chat": {"id": self.chat_id}}
            if method == "answerCallbackQuery":
                return True
            if method == "getUpdates":
                return self._get_updates(int(body.get("offset") or 0), body.get("timeout") or 0)
        return None

    def _get_updates(self, offset: int, timeout: float) -> list[dict[str, Any]]:
        # Called with the lock held; Telegram forgets updates below the offset.
        self.polls += 1
        self.updates = [u for u in self.updates if u["update_id"] >= offset]
        if not self.updates:
            self.lock.wait(min(float(timeout), self.longest_wait_s))
            self.updates = [u for u in self.updates if u["update_id"] >= offset]
        return list(self.updates)

    # -- the test's hands ---------------------------------------------------------------------

    def press(self, user_id: int, data: str) -> int:
        """Queue a button press from ``user_id`` carrying ``data``; return its update id."""
        with self.lock:
            self._next_update += 1
            update_id = self._next_update
            self.updates.append(
                {
                    "update_id": update_id,
                    "callback_query": {
                        "id": f"cb{update_id}",
                        "from": {"id": user_id, "is_bot": False, "first_name": "T"},
                        "data": data,
                        "message": {"message_id": 1, "chat": {"id": self.chat_id}},
                    },
                }
            )
            self.lock.notify_all()
            return update_id

    def queue_update(self, content: dict[str, Any]) -> int:
        """Queue an update of any shape (``content`` beside its ``update_id``); return its id."""
        with self.lock:
            self._next_update += 1
            self.updates.append({"update_id": self._next_update, **content})
            self.lock.notify_all()
            return self._next_update

    def wake(self) -> None:
        """End every long poll waiting now (each answers without updates)."""
        with self.lock:
            self.lock.notify_all()

    def of(self, method: str) -> list[Call]:
        with self.lock:
            return [call for call in self.calls if call.method == method]


_HANG = object()
