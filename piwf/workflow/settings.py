"""Live settings: a JSON document per workflow scope that authorized people and sessions may
change while the run goes on, each attempt seeing one fixed copy.

::

    define_workflow(..., settings=workflow_settings(
        initial={"route": "fast", "limit": 3},        # or a callable of the parsed input
        parse=Settings,                                # a pydantic model or a callable
        description="how the review is routed",
        paths=[allow_path("/route", read=["human", "session"], replace=["human"])],
    ))

    piwf run settings RUN --patch '[{"op": "replace", "path": "/route", "value": "careful"}]'

The run's first node in a scope (the root workflow, or each entry of a mount) creates the
scope with the initial value (change 0). Every attempt records the change number and value it
started with and sees exactly that copy as ``ctx.settings`` (parsed), for as long as it runs; a
change accepted meanwhile reaches only later attempts. A change is an RFC 6902 patch
(:mod:`piwf.json_patch`) that every operation's pointer authorizes: an operation that writes
needs a ``replace`` grant, a ``test`` a ``read`` grant, for the actor's kind (``human`` for
the CLI and clients, ``session`` for the run's origin session), on an allowed path that
contains the pointer. The patched value must pass ``parse`` (checked in a child from the
recorded sources: the server runs no workflow code) and is audited as a
``settings.changed`` event with the patch.

:func:`settings_route` is a pure choice made from ``ctx.settings``: when a newer change was
accepted between the attempt's start and its finish, the choice is not kept and the visit is
tried again with the newer copy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from piwf import canonical
from piwf.canonical import JsonValue
from piwf.errors import CanonicalJsonError, WorkflowDefinitionError
from piwf.json_patch import JsonPatchError, parse_pointer

#: Who may be granted a path: a person (CLI, client) or the run's origin session.
SETTINGS_ACTORS: frozenset[str] = frozenset({"human", "session"})
#: Largest settings document (canonical JSON bytes).
MAX_SETTINGS_BYTES = 64 * 1024
MAX_DESCRIPTION_CHARS = 1000


class SettingsError(ValueError):
    """A settings value the scope refuses: not JSON, too large, or refused by ``parse``."""


@dataclass(frozen=True)
class SettingsPath:
    """A JSON pointer prefix and which actor kinds may read and replace what lies under it."""

    path: str
    tokens: tuple[str, ...]
    read: frozenset[str]
    replace: frozenset[str]

    def structure(self) -> dict[str, JsonValue]:
        """This grant's part of the definition snapshot."""
        read: list[JsonValue] = [*sorted(self.read)]
        replace: list[JsonValue] = [*sorted(self.replace)]
        return {"path": self.path, "read": read, "replace": replace}


def allow_path(path: str, *, read: Sequence[str] = (), replace: Sequence[str] = ()) -> SettingsPath:
    """Grant ``read`` and ``replace`` on ``path`` (an RFC 6901 pointer, ``""`` for all) to the
    named actor kinds (``"human"``, ``"session"``). A ``replace`` grant implies ``read``."""
    label = f"allow_path({path!r})"
    try:
        tokens = parse_pointer(path)
    except JsonPatchError as error:
        raise WorkflowDefinitionError(f"{label}: {error}") from None
    grants = {}
    for name, actors in (("read", read), ("replace", replace)):
        if isinstance(actors, str) or not isinstance(actors, Sequence):
            raise WorkflowDefinitionError(f"{label}: {name} must be a list of actor kinds")
        unknown = sorted(str(actor) for actor in actors if actor not in SETTINGS_ACTORS)
        if unknown:
            raise WorkflowDefinitionError(
                f"{label}: unknown actor kind(s) {', '.join(unknown)} in {name}; use "
                f"{', '.join(sorted(SETTINGS_ACTORS))}"
            )
        grants[name] = frozenset(actors)
    return SettingsPath(path, tokens, grants["read"] | grants["replace"], grants["replace"])


@dataclass(frozen=True)
class WorkflowSettings:
    """The live settings of one workflow; create it with :func:`workflow_settings`."""

    initial: JsonValue | Callable[[Any], Any]
    parse: Callable[[Any], Any] | type[Any] | None
    description: str | None
    paths: tuple[SettingsPath, ...]

    def initial_value(self, workflow_input: Any) -> JsonValue:
        """The scope's first value (``initial``, or ``initial(input)``), checked by ``parse``;
        raises :class:`SettingsError`."""
        value = self.initial(workflow_input) if callable(self.initial) else self.initial
        return self.normalise(value)

    def normalise(self, value: Any) -> JsonValue:
        """Return the JSON a value is stored as once ``parse`` accepted it (a model's JSON
        dump when ``parse`` returns a model); raises :class:`SettingsError`."""
        checked = _to_json(value)
        parsed = self.parsed(checked)
        stored: Any = checked
        if self.parse is not None and parsed is not None:
            dump = getattr(parsed, "model_dump", None)
            stored = dump(mode="json") if callable(dump) else parsed
        try:
            result = _to_json(stored)
        except SettingsError:  # a parser returning its own type: the checked JSON is stored
            result = checked
        if len(canonical.encode(result)) > MAX_SETTINGS_BYTES:
            raise SettingsError(f"settings are larger than {MAX_SETTINGS_BYTES} bytes")
        return result

    def parsed(self, value: JsonValue) -> Any:
        """What callbacks see as ``ctx.settings``: ``parse(value)`` (or ``value``)."""
        parser = self.parse
        if parser is None:
            return value
        try:
            validate = getattr(parser, "model_validate", None)
            return validate(value) if callable(validate) else parser(value)
        except Exception as error:
            raise SettingsError(f"parse refused the settings: {_refusal(error)}") from error

    def structure(self) -> dict[str, JsonValue]:
        """This workflow's settings in the definition snapshot (what the server authorizes
        with: the grants, and whether a ``parse`` must check a change)."""
        return {
            "description": self.description,
            "parses": self.parse is not None,
            "paths": [allowed.structure() for allowed in self.paths],
        }


def workflow_settings(
    *,
    initial: JsonValue | Callable[[Any], Any],
    parse: Callable[[Any], Any] | type[Any] | None = None,
    description: str | None = None,
    paths: Sequence[SettingsPath] = (),
) -> WorkflowSettings:
    """Declare a workflow's live settings (``define_workflow(settings=...)``).

    ``initial`` is a JSON value, or a callable of the parsed workflow input returning one.
    ``parse`` (a pydantic model class or a callable) checks every value the scope takes and
    gives callbacks their ``ctx.settings``. ``paths`` (:func:`allow_path`) say who may read and
    change what; without a grant nobody may change anything.
    """
    if not callable(initial):
        try:
            _to_json(initial)
        except SettingsError as error:
            raise WorkflowDefinitionError(f"workflow_settings(): initial {error}") from None
    if parse is not None and not callable(parse):
        raise WorkflowDefinitionError(
            "workflow_settings(): parse must be a pydantic model class or a callable"
        )
    if description is not None and (
        not isinstance(description, str) or len(description) > MAX_DESCRIPTION_CHARS
    ):
        raise WorkflowDefinitionError(
            f"workflow_settings(): description must be a string of at most "
            f"{MAX_DESCRIPTION_CHARS} characters"
        )
    if not all(isinstance(allowed, SettingsPath) for allowed in paths):
        raise WorkflowDefinitionError("workflow_settings(): paths must be allow_path(...) grants")
    seen = [allowed.path for allowed in paths]
    if len(set(seen)) != len(seen):
        raise WorkflowDefinitionError("workflow_settings(): a path is granted twice")
    return WorkflowSettings(initial, parse, description, tuple(paths))


def settings_route(
    run: Callable[[Any], str], *, choices: Sequence[str]
) -> Any:  # -> ComputeNode (imported late: nodes imports nothing of settings)
    """A pure route choice from ``ctx.settings``: ``run(ctx)`` returns one of ``choices`` and
    the node outputs ``{"choice": name}`` (switch on ``$output.choice``). A settings change
    accepted before the choice is committed sends the visit round again with the newer copy."""
    from piwf.workflow.nodes import ComputeNode

    if not callable(run):
        raise WorkflowDefinitionError("settings_route(): run must be callable")
    names = tuple(choices) if not isinstance(choices, str) else ()
    if not names or not all(isinstance(name, str) and name for name in names):
        raise WorkflowDefinitionError("settings_route(): choices must be a list of names")
    if len(set(names)) != len(names):
        raise WorkflowDefinitionError("settings_route(): a choice is named twice")

    def route(ctx: Any) -> JsonValue:
        chosen = run(ctx)
        if chosen not in names:
            raise ValueError(f"settings_route chose {chosen!r}, not one of {', '.join(names)}")
        return {"choice": chosen}

    return ComputeNode(run=route, settings_route=names)


def _refusal(error: Exception) -> str:
    """One line saying why ``parse`` refused: a pydantic error's first field and message."""
    from pydantic import ValidationError

    if isinstance(error, ValidationError) and error.errors():
        first = error.errors()[0]
        where = "/".join(str(part) for part in first["loc"]) or "the value"
        return f"{where}: {first['msg']}"
    text = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _to_json(value: Any) -> JsonValue:
    from piwf.workflow.invoke import to_json

    try:
        return to_json(value)
    except CanonicalJsonError as error:
        raise SettingsError(f"is not JSON: {error}") from None
