"""``piwf view``: the live terminal viewer, on Textual (the optional ``piwf[view]`` extra).

Only this package imports ``textual``; the CLI reaches it from its ``view`` command alone, so
the base install never needs it. The viewer is a client like the CLI: it reads the run view
(``piwf.run-view.v1``) through :class:`piwf.Client` and shows its ``display`` as the server
derived it. Its wording comes from the CLI's renderers, handed in as a :class:`Wording`, so
that every renderer says the same thing (the viewer never imports the CLI).

Screens: :mod:`.run_list` (the runs, live) and :mod:`.run_screen` (one run, live, with its
steps, logs and controls); :mod:`.app` puts them together.
"""

from __future__ import annotations

from piwf.viewer.app import ViewerApp, Wording

__all__ = ["ViewerApp", "Wording"]
