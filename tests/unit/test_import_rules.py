"""The import rules of DESIGN.md §2, checked on every module of ``piwf/`` as the tree now is.

docs/ARCHITECTURE.md ("Rules and why") states each rule and why it holds. Imports are read
with ``ast`` (:mod:`tests.unit.import_graph`): every import statement, at any depth, and every
``importlib.import_module`` of a literal name. A failure names each offending ``file:line``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import piwf

from .import_graph import Import, imports, modules, package_cycles, sql_strings, within

ROOT = Path(piwf.__file__).parent
STATE, SERVER, CLIENT, CLI, RUNNER = (
    "piwf.state",
    "piwf.server",
    "piwf.client",
    "piwf.cli",
    "piwf.runner",
)

#: (modules the rule covers, imports they may not make, the rule as DESIGN.md §2 words it)
FORBIDDEN: list[tuple[str, tuple[str, ...], str]] = [
    (STATE, (SERVER, CLIENT, CLI, RUNNER), "state/ never imports server/, client/, cli/, runner/"),
    (
        "piwf.workflow",
        (STATE, SERVER, CLIENT, CLI, RUNNER, "sqlite3"),
        "workflow/ imports neither state/ nor server/ (nor what would reach them)",
    ),
    (
        "piwf.resource",
        (STATE, SERVER, CLIENT, CLI, RUNNER, "sqlite3"),
        "resource/ is authoring code like workflow/",
    ),
    (
        "piwf.protocol",
        (STATE, SERVER, CLIENT, CLI, RUNNER, "sqlite3"),
        "protocol/ is sans-IO and shared by both ends",
    ),
    (CLIENT, (SERVER, CLI), "client/ and server/ never import each other; the CLI is above"),
    (SERVER, (CLIENT, CLI), "client/ and server/ never import each other; the CLI is above both"),
    (RUNNER, (SERVER, STATE, CLIENT, CLI), "runner/ and server/ never import each other"),
    (SERVER, (RUNNER,), "runner/ and server/ never import each other"),
    (
        "piwf.mcp",
        (STATE, SERVER, CLI, RUNNER, "piwf.workflow", "sqlite3"),
        "mcp/ is a client of the server like the CLI: it reaches it only through piwf.Client",
    ),
    (
        "piwf.viewer",
        (STATE, SERVER, CLI, RUNNER, "piwf.workflow", "sqlite3"),
        "viewer/ is a client like the CLI (which hands it its wording): only through piwf.Client",
    ),
    (
        "piwf.relay",
        (STATE, SERVER, CLI, RUNNER, "piwf.workflow", "piwf.mcp", "piwf.viewer", "sqlite3"),
        "relay/ is a client like the CLI: it reaches the server only through its socket",
    ),
]

#: The client never opens the live database; its two offline commands read an inactive file.
CLIENT_STATE_READERS = frozenset({"piwf.client.offline", "piwf.client.restore"})

#: What the CLI may import: its own modules, the client, config, the leaf modules every layer
#: shares, and the protocol's payload models (the values the client returns and it renders).
CLI_MAY_IMPORT = (
    CLI,
    CLIENT,
    "piwf.config",
    "piwf.errors",
    "piwf.canonical",
    "piwf._version",
    "piwf.protocol.payloads",
    "piwf.protocol.display_status",
    "piwf.protocol.agent_payloads",
    "piwf.protocol.resource_payloads",
    "piwf.protocol.state_payloads",
    "piwf.protocol.view_payloads",
    "piwf.protocol.log_payloads",
    "piwf.protocol.session_payloads",
    "piwf.protocol.session_capture_payloads",
    "piwf.protocol.workflow_payloads",
    "piwf.protocol.settings_payloads",
    "piwf.protocol.channel_payloads",
    # ``piwf mcp`` starts the MCP server, a client of the server built on piwf.Client.
    "piwf.mcp.server",
    # ``piwf view`` starts the Textual viewer (only from its command: VIEWER_IMPORTERS).
    "piwf.viewer",
    # ``piwf relay`` starts the WebSocket relay (only from its command: RELAY_IMPORTERS).
    "piwf.relay.server",
)

#: What the top-level group ``piwf.cli`` may import itself: it loads each command's module by
#: name from its COMMANDS table when the command runs, so ``piwf --version`` and ``--help`` stay
#: light (tests/unit/test_lazy_cli.py checks what they import at run time).
#: (``piwf.cli.safe_text`` only when a usage error is shown, to escape what it repeats; it
#: imports nothing of piwf.)
CLI_GROUP_MAY_IMPORT = frozenset(
    {"piwf._version", "piwf.canonical", "piwf.cli.collector", "piwf.cli.safe_text"}
)

#: The only CLI module that reaches the viewer, so the base install never imports Textual.
VIEWER_IMPORTERS = frozenset({"piwf.cli.view"})

#: The only CLI module that reaches the relay, and the only modules that import websockets
#: (the piwf[relay] extra): the relay itself and the client's side of it.
RELAY_IMPORTERS = frozenset({"piwf.cli.relay"})
WEBSOCKETS_IMPORTERS = ("piwf.relay", "piwf.client.websocket")
#: What the relay may take from the protocol: the byte-level frame rules, never the messages
#: (it carries frames; it does not read them).
RELAY_PROTOCOL = frozenset({"piwf.protocol.framing", "piwf.protocol.errors"})

#: The CLI's one way into the server: ``piwf server run`` calls its entry point.
CLI_TO_SERVER = frozenset(
    {
        ("piwf.cli.server", "piwf.server.lifecycle"),
        ("piwf.cli.server", "piwf.server.settings"),
        # The fork server is forked from the server once it has imported (start_helpers_early).
        ("piwf.cli.server", "piwf.server.children.start_methods"),
    }
)

#: Edges that break a rule today, each with the change that removes it. An entry that no longer
#: matches an import fails too, so the list cannot outlive its reason.
PENDING: dict[tuple[str, str], str] = {}

#: The only modules that may import psutil or setproctitle: the supervisor, processes.py and
#: the child entry points (a child's first acts: its lifeline and its title).
PROCESS_MODULES = frozenset(
    {
        "piwf.processes",
        "piwf.server.children.supervisor",
        # The fork server forked from the server takes its command line as its title.
        "piwf.server.children.forked_fork_server",
        "piwf.runner.entry",
        "piwf.runner.lifeline",
    }
)

ALL = imports(ROOT)


def where(found: Import) -> str:
    return f"{found.where(ROOT)} imports {found.target}"


@pytest.mark.parametrize(
    ("covered", "forbidden", "rule"),
    FORBIDDEN,
    ids=[f"{covered}-not-{'-'.join(forbidden)}" for covered, forbidden, _ in FORBIDDEN],
)
def test_each_layer_imports_only_in_its_direction(
    covered: str, forbidden: tuple[str, ...], rule: str
) -> None:
    assert any(within(name, covered) for name in modules(ROOT)), f"no module {covered}"
    broken = [
        where(found)
        for found in ALL
        if within(found.module.name, covered)
        and within(found.target, *forbidden)
        and (found.module.name, found.target) not in PENDING
    ]
    assert broken == [], f"{rule}:\n  " + "\n  ".join(broken)


def test_the_client_reads_state_only_in_its_offline_commands() -> None:
    broken = [
        where(found)
        for found in ALL
        if within(found.module.name, CLIENT)
        and found.module.name not in CLIENT_STATE_READERS
        and within(found.target, STATE, "sqlite3")
    ]
    assert broken == [], "client/ never opens the live database:\n  " + "\n  ".join(broken)
    used = {found.module.name for found in ALL if within(found.target, STATE)}
    assert used >= CLIENT_STATE_READERS, "an offline reader no longer reads state: drop it"


def test_the_cli_imports_the_client_and_reaches_the_server_only_through_its_entry_point() -> None:
    piwf_imports = [
        found for found in ALL if within(found.module.name, CLI) and within(found.target, "piwf")
    ]
    to_server = {
        (found.module.name, found.target) for found in piwf_imports if within(found.target, SERVER)
    }
    broken = [
        where(found)
        for found in piwf_imports
        if not within(found.target, *CLI_MAY_IMPORT)
        and (found.module.name, found.target) not in CLI_TO_SERVER
    ]
    assert broken == [], (
        "cli/ imports only the client, config, errors, canonical, the version and the protocol's"
        " payload models; the server only through its entry point:\n  " + "\n  ".join(broken)
    )
    assert to_server == CLI_TO_SERVER, f"the CLI's edges to the server changed: {to_server}"


def test_the_cli_group_imports_only_the_version_and_loads_commands_only_from_the_cli() -> None:
    from piwf.cli import COMMANDS

    group = sorted(
        where(found)
        for found in ALL
        if found.module.name == CLI
        and within(found.target, "piwf")
        and found.target not in CLI_GROUP_MAY_IMPORT
    )
    assert group == [], "piwf.cli loads its commands lazily; it imports:\n  " + "\n  ".join(group)
    # The commands' modules are imported by a name the import graph cannot read: each must be
    # a CLI module, so the rules above (which read every CLI module) cover what it imports.
    tree = modules(ROOT)
    outside = sorted(
        f"{name}: {entry.module}"
        for name, entry in COMMANDS.items()
        if entry.module not in tree or not within(entry.module, CLI) or entry.module == CLI
    )
    assert outside == [], "the lazy command table names a module outside piwf.cli:\n  " + (
        "\n  ".join(outside)
    )


def test_only_the_view_command_reaches_the_viewer_and_only_the_viewer_imports_textual() -> None:
    to_viewer = {
        found.module.name
        for found in ALL
        if within(found.target, "piwf.viewer") and not within(found.module.name, "piwf.viewer")
    }
    assert to_viewer == VIEWER_IMPORTERS, f"piwf.viewer is imported from {sorted(to_viewer)}"
    # The command imports the viewer when it runs: loading the CLI imports no Textual.
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, piwf.cli; print('textual' in sys.modules)"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert loaded.stdout.strip() == "False", "importing piwf.cli imported textual"
    textual = sorted(
        where(found)
        for found in ALL
        if within(found.target, "textual") and not within(found.module.name, "piwf.viewer")
    )
    assert textual == [], "only piwf.viewer imports textual:\n  " + "\n  ".join(textual)


def test_only_the_relay_command_reaches_the_relay_and_only_the_relay_sides_import_websockets() -> (
    None
):
    to_relay = {
        found.module.name
        for found in ALL
        if within(found.target, "piwf.relay") and not within(found.module.name, "piwf.relay")
    }
    assert to_relay == RELAY_IMPORTERS, f"piwf.relay is imported from {sorted(to_relay)}"
    websockets = sorted(
        where(found)
        for found in ALL
        if within(found.target, "websockets")
        and not within(found.module.name, *WEBSOCKETS_IMPORTERS)
    )
    assert websockets == [], "only the relay sides import websockets:\n  " + "\n  ".join(websockets)
    # Loading the CLI or the client imports no websockets: a remote client imports it when it
    # connects, the relay command when it runs.
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, piwf.cli, piwf.client, piwf.client.websocket;"
            " print('websockets' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert loaded.stdout.strip() == "False", "importing piwf.cli or piwf.client imported websockets"


def test_the_relay_reads_no_message_only_the_frame_rules() -> None:
    broken = sorted(
        where(found)
        for found in ALL
        if within(found.module.name, "piwf.relay")
        and within(found.target, "piwf.protocol")
        and found.target not in RELAY_PROTOCOL
    )
    assert broken == [], "relay/ carries frames and parses no message:\n  " + "\n  ".join(broken)


def test_no_piwf_module_is_imported_by_name() -> None:
    hidden = [where(found) for found in ALL if found.by_name and within(found.target, "piwf")]
    assert hidden == [], (
        "import piwf modules with an import statement (a lazy one inside a function is fine),"
        " so the rules above see the edge:\n  " + "\n  ".join(hidden)
    )


def test_pending_exceptions_still_match_an_import() -> None:
    existing = {(found.module.name, found.target) for found in ALL}
    stale = sorted(edge for edge in PENDING if edge not in existing)
    assert stale == [], f"remove these from PENDING, the import is gone: {stale}"


def test_psutil_and_setproctitle_only_in_the_supervisor_processes_and_entry_points() -> None:
    users = {
        found.module.name: where(found)
        for found in ALL
        if within(found.target, "psutil", "setproctitle")
    }
    broken = sorted(line for name, line in users.items() if name not in PROCESS_MODULES)
    assert broken == [], (
        f"psutil and setproctitle belong in {sorted(PROCESS_MODULES)}:\n  " + "\n  ".join(broken)
    )
    unused = sorted(PROCESS_MODULES - set(users))
    assert unused == [], f"these no longer import psutil or setproctitle; drop them: {unused}"


def test_sqlite_is_imported_only_by_the_state_package() -> None:
    # faults.py names sqlite3's exception class to imitate SQLite errors; it opens nothing.
    broken = [
        where(found)
        for found in ALL
        if found.target == "sqlite3"
        and not within(found.module.name, STATE)
        and found.module.name != "piwf.faults"
    ]
    assert broken == [], "only state/ touches SQLite:\n  " + "\n  ".join(broken)


def test_nothing_imports_pickle() -> None:
    broken = [where(found) for found in ALL if within(found.target, "pickle", "cloudpickle")]
    assert broken == [], "pipes and sockets carry canonical JSON only:\n  " + "\n  ".join(broken)


def test_no_sql_outside_the_state_package() -> None:
    found = [
        f"{module.path.relative_to(ROOT.parent)}:{line} ({words} ...)"
        for module in modules(ROOT).values()
        if not within(module.name, STATE)
        for line, words in sql_strings(module.path)
    ]
    assert found == [], (
        "SQL belongs to the state module that owns the table, as a named constant behind a"
        " function with a contract docstring:\n  " + "\n  ".join(found)
    )


def test_no_import_cycle_between_packages() -> None:
    cycles = [cycle.describe(ROOT) for cycle in package_cycles(ROOT)]
    assert cycles == [], "packages that import each other:\n  " + "\n  ".join(cycles)
