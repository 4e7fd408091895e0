"""``Client`` methods of the state database (``state.*``): its counts, a check of its
invariants, a verified backup, and pruning finished runs."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from piwf.client.arguments import (
    absolute_path_argument,
    build_payload,
    path_argument,
    whole_number_argument,
)
from piwf.client.calls import ClientCalls
from piwf.protocol.payloads import EmptyPayload

if TYPE_CHECKING:
    from piwf.protocol.state_payloads import BackupReceipt, PruneReport, StateStatus, VerifyReceipt


class StateMethods(ClientCalls):
    """The state database, through the server (the client never opens the live file)."""

    def state_status(self) -> StateStatus:
        """Return the state database's privacy-safe counts (``state.status``)."""
        from piwf.protocol.state_payloads import StateStatus

        return self._call("state.status", EmptyPayload(), StateStatus)

    def state_verify(self) -> VerifyReceipt:
        """Check the database invariants (``state.verify``); ``valid`` is False on violations."""
        from piwf.protocol.state_payloads import VerifyReceipt

        return self._call("state.verify", EmptyPayload(), VerifyReceipt)

    def backup(
        self, destination: str | os.PathLike[str], *, idempotency_key: str | None = None
    ) -> BackupReceipt:
        """Write a verified backup to ``destination`` (made absolute against the current
        directory; it must not exist yet) through the server (``state.backup``)."""
        from piwf.protocol.state_payloads import BackupReceipt, StateBackupPayload

        destination = path_argument("destination", destination)
        payload = build_payload(StateBackupPayload, destination=str(destination))
        return self._call("state.backup", payload, BackupReceipt, idempotency_key=idempotency_key)

    def prune_preview(self, before_ms: int) -> PruneReport:
        """List the run trees a prune with cutoff ``before_ms`` (epoch ms) would delete and
        those protected state keeps (``state.prunePreview``); nothing changes. A ``before_ms``
        that is no time in epoch ms is an :class:`~piwf.errors.InvalidArgumentError`."""
        from piwf.protocol.state_payloads import PruneReport, StatePrunePreviewPayload

        payload = build_payload(StatePrunePreviewPayload, before=_cutoff(before_ms))
        return self._call("state.prunePreview", payload, PruneReport)

    def prune(
        self,
        before_ms: int,
        backup: str | os.PathLike[str],
        *,
        idempotency_key: str | None = None,
    ) -> PruneReport:
        """Back up to ``backup`` (an absolute path that must not exist; the copy is verified
        read-only first), then delete every expired run tree finished before ``before_ms``
        (``state.prune``). A ``backup`` that is no absolute path is an
        :class:`~piwf.errors.InvalidArgumentError` before anything is sent; a failed backup
        raises :class:`~piwf.errors.RejectedError` and deletes nothing."""
        from piwf.protocol.state_payloads import PruneReport, StatePrunePayload

        destination = absolute_path_argument(
            "backup", backup, "the absolute path of a new file (str or PathLike)"
        )
        payload = build_payload(
            StatePrunePayload, before=_cutoff(before_ms), backup=str(destination)
        )
        return self._call("state.prune", payload, PruneReport, idempotency_key=idempotency_key)


def _cutoff(before_ms: object) -> int:
    """``before_ms`` as a prune cutoff, checked under the name the caller gave it (the wire
    field is ``before``). Raises :class:`~piwf.errors.InvalidArgumentError`."""
    from piwf.protocol.state_payloads import MAX_TIMESTAMP_MS

    rule = "a time in epoch milliseconds: a whole number from 0, before the year 10000"
    cutoff = whole_number_argument(
        "before_ms", before_ms, rule, most=MAX_TIMESTAMP_MS, optional=False
    )
    assert cutoff is not None  # optional=False
    return cutoff
