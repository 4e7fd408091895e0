"""The benchmark suite of docs/PERFORMANCE.md, run as ``python -m tests.bench``.

No module here is named ``test_*``: the default pytest run collects nothing from it.
"""
