"""``piwf mcp``: the model-facing workflow tool as a Model Context Protocol server (stdio).

::

    MCP client (a coding agent) ── stdio, JSON-RPC ──▶ piwf mcp ── piwf.Client ──▶ piwf server

- :mod:`piwf.mcp.tools`: what each tool does, through :class:`piwf.client.Client` only (never
  the database), and the descriptions a model reads. It does not import the MCP SDK, so its
  behaviour is the same whichever transport carries it.
- :mod:`piwf.mcp.server`: the stdio server on the official ``mcp`` SDK (the optional extra
  ``piwf[mcp]``); it registers the tools and turns their failures into tool errors.

Two modes: the full tool (``list``, ``status``, ``start``, ``pause``, ``resume``, ``cancel``,
``answer``, ``update``, ``submit``) and, with ``--request REQUEST_ID``, only ``update`` and
``submit`` bound to that one agent request (what a headless agent command is configured with
through ``PIWF_MCP_CONFIG``). A protected human decision is never answerable through either.
"""
