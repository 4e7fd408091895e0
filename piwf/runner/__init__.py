"""Child-process entry points: the source resolver, the workflow and resource runners, the zygote.

Each child is ``python -m piwf.runner.<module> --fd N`` in its own session, or a fork of the
zygote (:mod:`piwf.runner.zygote`) that then looks the same; children never open SQLite and
speak canonical JSON over ``multiprocessing.connection`` framing with
``send_bytes``/``recv_bytes(maxlength)`` only.
"""
