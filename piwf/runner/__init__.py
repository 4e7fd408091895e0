"""Child-process entry points: the source resolver (and, later, workflow and resource runners).

Children are started with the ``spawn`` context, never open SQLite and speak canonical JSON over
``multiprocessing.connection`` pipes with ``send_bytes``/``recv_bytes(maxlength)`` only.
"""
