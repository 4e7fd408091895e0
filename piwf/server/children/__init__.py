"""Child processes of the server: how they start, how the loop talks to them, how they end.

==================  ==========================================================================
module              contents
==================  ==========================================================================
``supervisor``      start, watch and stop children, each in its own process group, with bounded
                    output capture and the process registry
``zygote``          the server's end of the fork server (:mod:`piwf.runner.zygote`)
``pipes``           non-blocking ``multiprocessing.connection`` framing for child pipes
``link``            framed, non-blocking I/O with one supervised child
``resolvers``       supervised source-resolver children (load and digest a workflow source)
==================  ==========================================================================

Workflow and resource-manager code runs only in these children, never in the server.
"""
