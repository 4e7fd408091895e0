"""Child-process entry points: the source resolver, the workflow and resource runners.

Every child is a ``multiprocessing`` process (forked by the server's fork server, or spawned)
that begins with :mod:`piwf.runner.bootstrap` (its own session and group, captured output, its
lifeline) and then runs one entry module (:class:`~piwf.processes.ChildKind`). Children never
open SQLite and speak canonical JSON over their ``multiprocessing.Pipe`` channel with
``send_bytes``/``recv_bytes(maxlength)`` only.
"""
