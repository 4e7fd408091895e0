"""The managed-resource store: resource objects, their reconciles and what a reconcile asks.

==================  ==========================================================================
module              contents
==================  ==========================================================================
``managed``         the resource object (spec, status, conditions, finalizers), its queue row
``reconciles``      a reconcile's claim, runner row, result CAS, failure backoff, recovery
``runners``         ``managed_resource_runners`` rows (one per reconcile process)
``status``          a result's status patch: condition merge, finalizer list
``calls``           what a running reconcile asks: managed effects, child workflow runs
``diagnostics``     the resource invariants of ``state verify``
==================  ==========================================================================

There is no facade: callers import the module they need (``from piwf.state.resources import
reconciles as rc``), and the modules import one another by full path.
"""
