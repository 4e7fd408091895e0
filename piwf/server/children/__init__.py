"""Child processes of the server: how they start, how the loop talks to them, how they end.

=====================  =======================================================================
module                 contents
=====================  =======================================================================
``supervisor``         the launcher: start children (each in its own session and process
                       group), report their pids and exits to the loop, stop and kill their
                       trees; the registry
``start_methods``      the ``multiprocessing`` context (``forkserver`` or ``spawn``), its helpers
``forkserver_launch``  the fork-server launch whose pid comes later (the loop never waits for it)
``capture``            bounded capture of children's stdout and stderr into private log files
``pipes``              non-blocking ``multiprocessing.connection`` framing for child pipes
``link``               framed, non-blocking I/O with one supervised child
``resolvers``          supervised source-resolver children (load and digest a workflow source)
=====================  =======================================================================

Workflow and resource-manager code runs only in these children, never in the server.
"""
