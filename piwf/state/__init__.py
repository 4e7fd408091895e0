"""The state layer: the only package that opens SQLite.

Store modules own their tables (``blobs``, ``records``, ``leases``, ``effects``, …) and take a
:class:`Transaction` from :meth:`StateDatabase.write` or :meth:`StateDatabase.read`. Their
transitions answer with the shared results of :mod:`piwf.lifecycle` (``Applied``, ``Adopted``,
``Conflict``, ``RecoveryRequired``).
"""

from piwf.state.database import StateDatabase, Transaction

__all__ = [
    "StateDatabase",
    "Transaction",
]
