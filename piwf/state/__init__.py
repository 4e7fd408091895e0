"""The state layer: the only package that opens SQLite.

Store modules own their tables (``blobs``, ``records``, ``leases``, ``effects``, …) and take a
:class:`Transaction` from :meth:`StateDatabase.write` or :meth:`StateDatabase.read`.
"""

from piwf.state.database import StateDatabase, Transaction
from piwf.state.results import Adopted, Applied, Conflict, LifecycleResult, RecoveryRequired

__all__ = [
    "Adopted",
    "Applied",
    "Conflict",
    "LifecycleResult",
    "RecoveryRequired",
    "StateDatabase",
    "Transaction",
]
