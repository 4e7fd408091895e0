"""A fork server leads one session of its own, which every child it forks shares.

Linux schedules by session first when autogroup scheduling is on (the default of most
distributions): each session is one group, and the CPU is shared fairly between the groups
that want it, then between the processes of a group. A child in a session of its own would be a
group of its own, so four busy runners would get four shares of the machine to the server's
one, and the server's answers to clients (``server.status``, ``run.list``) would queue behind
workflow code. Forked children therefore join the fork server's session (each still leads a
process group of its own, so one signal reaches everything it starts, and no child can take a
controlling terminal, since only a session leader can): the children of one server compete for
the CPU as one program, and the server keeps its own share.

The fork server imports this module first (:data:`~piwf.processes.FORKSERVER_PRELOAD`); the
server marks the environment it starts its fork server with
(:data:`~piwf.processes.CHILDREN_SESSION_VARIABLE`), so that an import anywhere else does
nothing. The variable is removed before the fork server forks, so no child inherits it.
A spawned child (``PIWF_START_METHOD=spawn``) leads a session of its own as before
(:func:`piwf.runner.bootstrap.enter_own_group`).
"""

from __future__ import annotations

import os

from piwf.processes import CHILDREN_SESSION_VARIABLE


def lead_children_session() -> bool:
    """Lead a new session when this process is a fork server the piwf server marked; return
    whether it does. A process that cannot (one that already leads a process group) stays
    where it is, and its children then make sessions of their own."""
    if os.environ.pop(CHILDREN_SESSION_VARIABLE, None) != "1":
        return False
    try:
        os.setsid()
    except OSError:
        return False
    return True


lead_children_session()
