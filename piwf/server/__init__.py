"""The piwf server: one process that owns the state database and answers clients.

It never imports workflow code; a source-resolver child loads workflow files for it.
"""
