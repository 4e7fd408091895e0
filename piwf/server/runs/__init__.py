"""Workflow runs in the server: the runner pool, the ``run.*`` handlers, answers, recovery.

==================  ==========================================================================
module              contents
==================  ==========================================================================
``pool``            the bounded runner pool: admission, one runner child per run generation,
                    its calls, claim renewal, reaping, rescue of expired claims
``content_transfer``  content references between the pool and one runner (values past a frame)
``handlers``        the ``run.*`` operations
``answers``         checkpoint and decision answers, request listing, decision deadlines
``recovery``        startup recovery of runners and claims a killed server left behind
==================  ==========================================================================

The durable transitions themselves live in :mod:`piwf.state.execution`.
"""
