"""The source resolver child: load one workflow file, return its snapshot, digest and sources.

The server never imports workflow code; it starts this child like the runners
(:mod:`piwf.runner.bootstrap`: its own session and process group, its lifeline, then
:func:`run_child`), sends one request over its channel and reads one reply, both canonical JSON
frames::

    request  {"workflow": str, "projectPath": str | null, "stateHome": str}
             (or a resource-manager request: :mod:`piwf.runner.resource_resolve`, or a
             settings check: :mod:`piwf.runner.settings_check`)
    reply    {"ok": true, "workflowName": str, "workflowRef": str, "definitionDigest": hex,
              "snapshot": {...}, "title": str | null, "runTitle": str | null,
              "input": {"kind", ...},
              "sources": {"root": source, "mounted": [source, ...]}}
          or {"ok": false, "error": {"code": str, "message": str}}
    source   {"mountPath", "referenceKind", "reference", "location", "sha256", "piwfVersion"}

The workflow and every ``include("name")`` in it are discovered from the request's project
and state home, the order ``run start NAME`` uses
(:func:`~piwf.workflow.sources.resolve_workflow`); the sources say which file each name found.

Whatever the workflow module does at import time happens here, in a throwaway process whose
lifeline (:mod:`piwf.runner.lifeline`) begins before the import: it dies with its server, and
whatever the import started ends with it.
"""

from __future__ import annotations

from multiprocessing.connection import Connection
from pathlib import Path

from piwf import canonical, faults
from piwf.canonical import JsonValue
from piwf.config import MAX_FRAME_BYTES
from piwf.errors import PiwfError, WorkflowDefinitionError
from piwf.runner.entry import EXIT_OK, name_process, print_user_traceback
from piwf.runner.lifeline import Lifeline


def run_child(connection: Connection, _lifeline: Lifeline) -> int:
    """Serve one request over ``connection``; return the process exit code (the processes the
    import started are ended when it returns, by :func:`~piwf.runner.entry.serve_channel`)."""
    resolver_main(connection)
    return EXIT_OK


def resolver_main(connection: Connection) -> None:
    """Serve one request over ``connection`` with one reply (any failure becomes a typed
    reply; only a lost connection raises)."""
    name_process("piwf resolver")
    request: JsonValue = None
    try:
        request = canonical.decode(connection.recv_bytes(maxlength=MAX_FRAME_BYTES))
        reply = resolve(request)
    except PiwfError as error:
        print_user_traceback(error)  # the server points the message at this child's log
        reply = {"ok": False, "error": {"code": error.code, "message": _bounded(str(error))}}
    except Exception as error:  # any failure of user code becomes a typed reply
        print_user_traceback(error)
        message = _bounded(f"{type(error).__name__}: {error}")
        reply = {"ok": False, "error": {"code": "workflowLoad", "message": message}}
    encoded = canonical.encode(reply)
    if len(encoded) > MAX_FRAME_BYTES:
        encoded = canonical.encode(_too_large(request, len(encoded)))
    faults.point("resolver.before_reply")
    connection.send_bytes(encoded)


def _too_large(request: JsonValue, size: int) -> dict[str, JsonValue]:
    """The refusal sent instead of a reply of ``size`` bytes, past what one frame carries: a
    definition that large carries data, which belongs in the input or a file."""
    subject = "the workflow"
    if isinstance(request, dict) and isinstance(request.get("workflow"), str):
        subject = _bounded(str(request["workflow"]), 300)
    message = (
        f"{subject}: its compiled definition takes {size} bytes, over the {MAX_FRAME_BYTES} a"
        " definition may take; a definition that large carries data (many choices, long"
        " labels, prompts or constants): pass the data as the run's input, or have a node"
        " read it from a file"
    )
    return {"ok": False, "error": {"code": WorkflowDefinitionError.code, "message": message}}


def resolve(request: JsonValue) -> dict[str, JsonValue]:
    """Resolve and compile the workflow named in ``request``; raise ``PiwfError`` on failure."""
    from piwf.workflow.sources import resolve_workflow

    if isinstance(request, dict) and request.get("kind") == "resourceManager":
        from piwf.runner.resource_resolve import resolve_resource_manager

        return resolve_resource_manager(request)
    if isinstance(request, dict) and request.get("kind") == "settingsCheck":
        from piwf.runner.settings_check import check_settings

        return check_settings(request)
    if not isinstance(request, dict) or not isinstance(request.get("workflow"), str):
        raise ValueError("resolver request needs a workflow reference")
    reference = request["workflow"]
    assert isinstance(reference, str)
    project = request.get("projectPath")
    home = request.get("stateHome")
    loaded = resolve_workflow(
        reference,
        Path(project) if isinstance(project, str) else None,
        Path(home) if isinstance(home, str) else None,
    )
    title = loaded.definition.title
    return {
        "ok": True,
        "workflowName": loaded.definition.name,
        "workflowRef": reference,
        "definitionDigest": loaded.compiled.digest,
        "snapshot": loaded.compiled.snapshot,
        "title": title if isinstance(title, str) else None,
        "runTitle": run_title(loaded.definition.name, title),
        "input": input_contract(loaded.definition.input),
        "sources": loaded.sources.to_json(),
    }


def run_title(name: str, title: object) -> str | None:
    """The title a new run is committed with (``runTitle``): the declared string, or the
    workflow's name when none is declared, which is what the run's first runner would record.
    None for a callable title: it needs the input, so that runner resolves it. Committing the
    title with the run keeps it on a run that never executes (cancelled while queued)."""
    if title is None:
        return name
    return title if isinstance(title, str) else None


def input_contract(parser: object) -> dict[str, JsonValue]:
    """What ``define_workflow(input=...)`` accepts (``workflow.show``): any JSON value, a
    pydantic model (its name, and its JSON schema when that is canonical JSON of at most
    64 KiB), or a parser callable (its name)."""
    from pydantic import BaseModel

    if parser is None:
        return {"kind": "any"}
    name = str(getattr(parser, "__qualname__", type(parser).__name__))[:200]
    if not (isinstance(parser, type) and issubclass(parser, BaseModel)):
        return {"kind": "parser", "parser": name}
    contract: dict[str, JsonValue] = {"kind": "model", "model": name}
    try:
        schema = canonical.decode(canonical.encode(parser.model_json_schema()))
    except Exception:  # a schema piwf cannot carry (floats, huge): the name is still shown
        return contract
    if len(canonical.encode(schema)) <= _MAX_INPUT_SCHEMA_BYTES:
        contract["jsonSchema"] = schema
    return contract


_MAX_INPUT_SCHEMA_BYTES = 64 * 1024


def _bounded(text: str, limit: int = 1000) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
