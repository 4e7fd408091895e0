"""Managed resources in the server: reconciles, their calls, the ``resource.*`` handlers.

==================  ==========================================================================
module              contents
==================  ==========================================================================
``reconciler``      admission (alternating with runs), one resource-runner child per reconcile,
                    its deadline and its end
``calls``           a resource runner's calls applied to the store
``handlers``        the ``resource.*`` operations (apply resolves the manager in a child first)
``recovery``        startup recovery of the reconciles a killed server left behind
==================  ==========================================================================

The durable transitions live in :mod:`piwf.state.resources`.
"""
