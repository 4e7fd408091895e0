"""The installed ``piwf`` script on real state files: offline verify of damaged copies,
``state restore`` around real servers, and JSON arguments at the protocol's value limits.

Servers are started the way users start them (``piwf server start``, ``piwf run start``
auto-starts one); the fixture stops them and kills whatever still runs for the home.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cli.test_cli_e2e import HELLO, REPO, Piwf, processes_of, wait_gone
from tests.cli_process import run_piwf
from tests.server.harness import state_violations
from tests.state.files import (
    make_database,
    overwrite,
    private_copy,
    snapshot,
    table_leaf_page,
    wal_of,
)

MAX_SAFE = 2**53 - 1


@contextlib.contextmanager
def piwf_home() -> Iterator[Piwf]:
    """The script with a new home; afterwards every process of the home is gone and its
    database passes verify."""
    root = Path(tempfile.mkdtemp(prefix="pf", dir="/tmp"))
    runner = Piwf(root / "h")
    try:
        yield runner
    finally:
        with contextlib.suppress(subprocess.TimeoutExpired):
            runner.run("server", "stop")
        for process in processes_of(runner.home):
            if process.pid != os.getpid():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
                wait_gone(process.pid, 10)
        violations = state_violations(runner.home)
        subprocess.run(["rm", "-rf", str(root)], check=True)
    assert violations == [], f"the test left a database that fails verify: {violations}"


@pytest.fixture
def cli() -> Iterator[Piwf]:
    with piwf_home() as runner:
        yield runner


def verify_json(cli: Piwf, path: Path) -> tuple[int, dict[str, Any], str]:
    result = cli.run("state", "verify", str(path), "--json")
    assert result.stdout.count("\n") == 1, result.stdout
    return result.returncode, json.loads(result.stdout), result.stderr


# -- offline verify of damaged files --------------------------------------------------------


def damage_a_table_page(path: Path) -> None:
    leaf, page_size = table_leaf_page(path, "blobs")
    overwrite(path, (leaf - 1) * page_size, b"\x00" * 8)  # the leaf's page header


def damage_the_schema_meta_page(path: Path) -> None:
    """Damage the page the identity check reads after the header (it raised a traceback)."""
    connection = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    try:
        (root,) = connection.execute(
            "SELECT rootpage FROM sqlite_schema WHERE name = 'schema_meta'"
        ).fetchone()
        (page_size,) = connection.execute("PRAGMA page_size").fetchone()
    finally:
        connection.close()
    overwrite(path, (root - 1) * page_size, b"\x0d" + b"\xff" * 7)


def truncate_three_pages(path: Path) -> None:
    os.truncate(path, path.stat().st_size - 3 * 4096)


DAMAGE: dict[str, tuple[Callable[[Path], None], str]] = {
    "table page": (damage_a_table_page, "SQLite cannot read the file: database disk image"),
    "schema_meta page": (damage_the_schema_meta_page, "SQLite cannot read the file: database"),
    "truncated": (truncate_three_pages, "pages but the file holds"),
    "truncated mid-page": (
        lambda path: os.truncate(path, path.stat().st_size - 1000),
        "not a whole number of 4096-byte pages",
    ),
    "header": (lambda path: overwrite(path, 16, b"\x03\x00"), "page size field 768"),
    "not sqlite": (lambda path: path.write_bytes(b"hello, not a database\n" * 300), "header"),
    "empty": (lambda path: path.write_bytes(b""), "the file is empty"),
}


@pytest.fixture(scope="module")
def sound_backup(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A closed piwf database whose blobs table spans many pages."""
    directory = tmp_path_factory.mktemp("sound")
    directory.chmod(0o700)
    path = directory / "state.sqlite"
    make_database(path, blobs=200, projects=3)
    return path


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_offline_verify_reports_damage_as_integrity_violations(
    cli: Piwf, sound_backup: Path, tmp_path: Path, kind: str
) -> None:
    damage, expected = DAMAGE[kind]
    copy = private_copy(sound_backup, tmp_path / "damaged.sqlite")
    damage(copy)
    before = snapshot(tmp_path)

    code, document, stderr = verify_json(cli, copy)
    assert code == 1, (document, stderr)
    assert document["valid"] is False
    assert document["violations"], document
    assert {violation["code"] for violation in document["violations"]} == {"integrity"}
    assert any(expected in violation["detail"] for violation in document["violations"]), document
    assert "Traceback" not in stderr

    human = cli.run("state", "verify", str(copy))
    assert human.returncode == 1
    assert human.stdout.startswith("state is INVALID: ")
    assert "  integrity: " in human.stdout
    assert "nothing was repaired: keep this file for a report, and restore a backup" in human.stdout
    assert "Traceback" not in human.stderr
    assert snapshot(tmp_path) == before, "verify wrote to or beside the file"


def test_offline_verify_of_the_sound_copy_is_valid(
    cli: Piwf, sound_backup: Path, tmp_path: Path
) -> None:
    copy = private_copy(sound_backup, tmp_path / "sound.sqlite")
    assert verify_json(cli, copy)[:2] == (0, {"valid": True, "violations": []})


@pytest.mark.parametrize("suffix", ["-wal", "-journal"])
def test_offline_verify_refuses_a_file_with_a_journal_beside_it(
    cli: Piwf, sound_backup: Path, tmp_path: Path, suffix: str
) -> None:
    copy = private_copy(sound_backup, tmp_path / "copy.sqlite")
    Path(f"{copy}{suffix}").write_bytes(b"")
    code, document, _ = verify_json(cli, copy)
    assert code == 1
    assert document["error"]["code"] == "liveDatabase"
    assert suffix in document["error"]["message"]


def test_offline_verify_of_another_applications_database_is_incompatible(
    cli: Piwf, tmp_path: Path
) -> None:
    other = tmp_path / "other.db"
    connection = sqlite3.connect(other)
    connection.execute("CREATE TABLE notes (body TEXT)")
    connection.close()
    other.chmod(0o600)
    code, document, _ = verify_json(cli, other)
    assert code == 1
    # The advice is a backup's, not the live state file's (move it aside, start piwf again).
    assert document["error"] == {
        "code": "incompatibleState",
        "message": f"piwf state at {other} is incompatible: foreign application id 0x00000000:"
        " it is not a state database of this piwf version; give a file that `piwf state"
        " backup` wrote",
    }


# -- state restore ---------------------------------------------------------------------------


def run_ids(cli: Piwf) -> list[str]:
    return sorted(run["runId"] for run in cli.json("run", "list")["runs"])


def start_hello(cli: Piwf, who: str) -> str:
    run = cli.json("run", "start", HELLO, "--input", json.dumps({"who": who}), "--wait")["run"]
    assert run["status"] == "completed"
    return str(run["runId"])


def test_restore_is_refused_while_a_server_runs(cli: Piwf, tmp_path: Path) -> None:
    start_hello(cli, "Ada")
    backup = tmp_path / "backup.sqlite"
    cli.json("state", "backup", str(backup))
    database = cli.home / "state.sqlite"
    inode = database.stat().st_ino

    refused = cli.json("state", "restore", str(backup), exit_code=1)
    assert refused["error"]["code"] == "serverRunning"
    assert "stop the server first: piwf server stop" in refused["error"]["message"]
    human = cli.run("state", "restore", str(backup))
    assert human.returncode == 1
    assert "stop the server first: piwf server stop" in human.stderr
    assert database.stat().st_ino == inode
    assert [p.name for p in cli.home.iterdir() if "replaced" in p.name or "restore" in p.name] == []
    assert cli.json("server", "status")["state"] == "running"


def test_restore_replaces_a_crashed_database_and_moves_its_wal_aside(
    cli: Piwf, tmp_path: Path
) -> None:
    kept = start_hello(cli, "kept")
    backup = tmp_path / "backup.sqlite"
    cli.json("state", "backup", str(backup))
    lost = start_hello(cli, "lost")
    server = cli.json("server", "status")
    assert server["state"] == "running"
    # Crash the server: its -wal and -shm stay beside the database.
    (pid,) = {p.pid for p in processes_of(cli.home) if "server run" in " ".join(p.cmdline())}
    os.kill(pid, signal.SIGKILL)
    assert wait_gone(pid, 15)
    database = cli.home / "state.sqlite"
    family = {suffix: Path(f"{database}{suffix}") for suffix in ("", "-wal", "-shm")}
    assert all(path.exists() for path in family.values()), "a crash leaves -wal and -shm"
    old = {suffix: path.read_bytes() for suffix, path in family.items()}

    report = cli.json("state", "restore", str(backup))
    assert report["backup"] == str(backup)
    assert report["database"] == str(database)
    assert report["bytes"] == backup.stat().st_size == database.stat().st_size
    moved = {Path(item["from"]).name: Path(item["to"]) for item in report["movedAside"]}
    assert sorted(moved) == ["state.sqlite", "state.sqlite-shm", "state.sqlite-wal"]
    base = moved["state.sqlite"]
    assert base.parent == cli.home and base.name.startswith("state.sqlite.replaced-")
    for suffix, content in old.items():
        aside = moved[f"state.sqlite{suffix}"]
        assert aside == base.with_name(base.name + suffix), "the names keep SQLite's pairing"
        assert aside.read_bytes() == content, "moved aside byte for byte"
        assert stat.S_IMODE(aside.stat().st_mode) == 0o600
    assert database.read_bytes() == backup.read_bytes()
    assert stat.S_IMODE(database.stat().st_mode) == 0o600
    assert not wal_of(database).exists()
    assert [p.name for p in cli.home.iterdir() if p.name.startswith(".state.sqlite.restore")] == []

    assert cli.json("server", "start")["started"] is True
    assert run_ids(cli) == [kept], f"the restored state has {kept} and not {lost}"
    assert cli.json("state", "verify") == {"valid": True, "violations": []}


def test_restore_after_a_clean_stop_prints_what_it_moved(cli: Piwf, tmp_path: Path) -> None:
    kept = start_hello(cli, "kept")
    backup = tmp_path / "backup.sqlite"
    cli.json("state", "backup", str(backup))
    start_hello(cli, "lost")
    assert cli.json("server", "stop")["wasRunning"] is True

    result = cli.run("state", "restore", str(backup))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"restored {backup} as {cli.home / 'state.sqlite'} (")
    assert lines[1].startswith("moved aside: state.sqlite -> state.sqlite.replaced-")
    assert lines[-1] == "start the server with: piwf server start"
    assert run_ids(cli) == [kept]


def test_backup_and_restore_print_a_path_with_control_characters_escaped(
    cli: Piwf, tmp_path: Path
) -> None:
    """A path as typed may hold a line break or a bidirectional override: printed raw they
    would forge a line or reorder what the terminal shows, so the human output escapes them."""
    start_hello(cli, "kept")
    backup = tmp_path / "new\nline\u202ecod.sqlite"
    result = cli.run("state", "backup", str(backup))
    assert result.returncode == 0, result.stderr
    escaped = str(tmp_path / "new\\nline\\u202ecod.sqlite")
    assert result.stdout.splitlines() == [
        f"backup written to {escaped} ({backup.stat().st_size} bytes, verified)"
    ]
    assert cli.json("server", "stop")["wasRunning"] is True

    result = cli.run("state", "restore", str(backup))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].startswith(f"restored {escaped} as ")
    assert "\u202e" not in result.stdout


def test_restore_into_a_home_without_a_database_creates_it(cli: Piwf, tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir(mode=0o700)
    make_database(source / "state.sqlite", projects=2)
    report = cli.json("state", "restore", str(source / "state.sqlite"))
    assert report["movedAside"] == []
    assert stat.S_IMODE(cli.home.stat().st_mode) == 0o700
    assert (cli.home / "state.sqlite").read_bytes() == (source / "state.sqlite").read_bytes()


def test_restore_into_a_home_that_cannot_be_created_says_why_without_a_traceback(
    sound_backup: Path, tmp_path: Path
) -> None:
    plain_file = tmp_path / "f"
    plain_file.write_text("")
    cli = Piwf(plain_file / "h")
    result = cli.json("state", "restore", str(sound_backup), exit_code=1)
    assert result["error"] == {
        "code": "restoreRefused",
        "message": f"cannot create the state home {cli.home}: Not a directory; fix or move"
        " that path, or set PIWF_HOME to a directory you can write. Nothing was changed",
    }
    human = cli.run("state", "restore", str(sound_backup))
    assert human.returncode == 1
    assert human.stderr.startswith("Error: cannot create the state home"), human.stderr
    assert plain_file.read_text() == "" and not cli.home.exists()


@pytest.fixture
def stopped_home(cli: Piwf) -> Piwf:
    """A home with a database and a crashed server's -wal and -shm."""
    start_hello(cli, "Ada")
    (pid,) = {p.pid for p in processes_of(cli.home) if "server run" in " ".join(p.cmdline())}
    os.kill(pid, signal.SIGKILL)
    assert wait_gone(pid, 15)
    return cli


def refused_restore(cli: Piwf, backup: Path, code: str) -> str:
    before = snapshot(cli.home)
    result = cli.json("state", "restore", str(backup), exit_code=1)
    assert result["error"]["code"] == code, result
    assert snapshot(cli.home) == before, "a refused restore changed the home"
    message: str = result["error"]["message"]
    return message


@pytest.mark.parametrize("kind", ["table page", "schema_meta page", "truncated", "header", "empty"])
def test_restore_of_a_damaged_backup_is_refused_and_changes_nothing(
    stopped_home: Piwf, sound_backup: Path, tmp_path: Path, kind: str
) -> None:
    backup = private_copy(sound_backup, tmp_path / "damaged.sqlite")
    DAMAGE[kind][0](backup)
    message = refused_restore(stopped_home, backup, "restoreRefused")
    assert "does not verify" in message and "integrity: " in message


def test_restore_of_a_foreign_database_is_refused_and_changes_nothing(
    stopped_home: Piwf, tmp_path: Path
) -> None:
    other = tmp_path / "other.db"
    connection = sqlite3.connect(other)
    connection.execute("CREATE TABLE notes (body TEXT)")
    connection.close()
    other.chmod(0o600)
    message = refused_restore(stopped_home, other, "incompatibleState")
    assert str(other) in message and ".restore-" not in message
    assert "foreign application id" in message and "Back up and move" not in message


def test_restore_of_a_backup_with_its_own_wal_is_refused(
    stopped_home: Piwf, sound_backup: Path, tmp_path: Path
) -> None:
    backup = private_copy(sound_backup, tmp_path / "backup.sqlite")
    wal_of(backup).write_bytes(b"")
    message = refused_restore(stopped_home, backup, "restoreRefused")
    assert "-wal file beside it" in message


def test_restore_of_the_live_database_itself_is_refused(stopped_home: Piwf) -> None:
    message = refused_restore(stopped_home, stopped_home.home / "state.sqlite", "restoreRefused")
    assert "itself" in message


@pytest.mark.parametrize("kind", ["a directory", "a symlink"])
def test_a_state_file_that_is_no_regular_file_is_refused_with_what_to_do(
    cli: Piwf, sound_backup: Path, tmp_path: Path, kind: str
) -> None:
    cli.home.mkdir(mode=0o700)
    database = cli.home / "state.sqlite"
    if kind == "a directory":
        database.mkdir()
        says = f"{database} is not a regular file (a directory); move it away, or set PIWF_HOME"
    else:
        database.symlink_to(private_copy(sound_backup, tmp_path / "elsewhere.sqlite"))
        says = f"{database} is a symlink; piwf opens only a real file: move the link away"
    started = cli.json("server", "start", exit_code=1)
    assert started["error"]["code"] == "unsafeStateHome"
    assert started["error"]["message"].startswith(says), started
    assert started["error"]["message"].endswith("or set PIWF_HOME to another directory")

    message = refused_restore(cli, sound_backup, "unsafeStateHome")
    assert message == (
        f"{database} is not a regular file ({kind}); move it away yourself, then restore"
        " again. Nothing was changed"
    ), "the restore names what is there, not a guess"
    assert database.is_symlink() if kind == "a symlink" else database.is_dir()
    database.unlink() if kind == "a symlink" else database.rmdir()  # so the fixture can verify


def test_restore_of_a_missing_backup_is_a_usage_error(cli: Piwf, tmp_path: Path) -> None:
    result = cli.json("state", "restore", str(tmp_path / "nope.sqlite"), exit_code=2)
    assert result["error"]["code"] == "usage"


# -- files verify and restore refuse alike --------------------------------------------------


def _symlink(backup: Path) -> Path:
    link = backup.with_name("link.sqlite")
    link.symlink_to(backup.name)
    return link


def _fifo(backup: Path) -> Path:
    fifo = backup.with_name("fifo.sqlite")
    os.mkfifo(fifo, 0o600)
    return fifo


def _open_mode(backup: Path) -> Path:
    backup.chmod(0o644)
    return backup


def _hard_linked(backup: Path) -> Path:
    os.link(backup, backup.with_name("second-name.sqlite"))
    return backup


#: How a sound backup becomes a file verify and restore must refuse, and the message's core.
UNSAFE_FILES: dict[str, tuple[Callable[[Path], Path], str]] = {
    "symlink": (_symlink, "is a symlink; give the backup file itself"),
    "fifo": (_fifo, "is not a regular file (a FIFO)"),
    "device": (lambda _backup: Path("/dev/null"), "is not a regular file (a character device)"),
    "open mode": (_open_mode, "has mode 0644, open to other users"),
    "hard link": (_hard_linked, "has 2 hard links"),
}


@pytest.mark.parametrize("kind", sorted(UNSAFE_FILES))
def test_verify_and_restore_refuse_an_unsafe_backup_alike_without_reading_it(
    stopped_home: Piwf, sound_backup: Path, tmp_path: Path, kind: str
) -> None:
    make_unsafe, expected = UNSAFE_FILES[kind]
    unsafe = make_unsafe(private_copy(sound_backup, tmp_path / "backup.sqlite"))

    # A deadline, not a sleep: a FIFO opened for reading would block the command for ever.
    verified = run_piwf(
        ["state", "verify", str(unsafe), "--json"], env=stopped_home.env, cwd=REPO, timeout=30
    )
    assert verified.returncode == 1, (verified.stdout, verified.stderr)
    assert verified.stdout.count("\n") == 1 and "Traceback" not in verified.stderr
    refusal = json.loads(verified.stdout)["error"]
    assert refusal["code"] == "unsafeStateHome", refusal
    assert f"{unsafe} {expected}" in refusal["message"]

    message = refused_restore(stopped_home, unsafe, "unsafeStateHome")
    assert message == refusal["message"], "restore refuses with verify's message"


# -- what a backup holds -----------------------------------------------------------------------


def test_backup_to_an_empty_path_is_a_usage_error(cli: Piwf) -> None:
    refused = cli.json("state", "backup", "", exit_code=2)
    assert refused["error"]["code"] == "usage"
    assert "empty; give the path of a new file" in refused["error"]["message"]
    human = cli.run("state", "backup", "")
    assert human.returncode == 2
    assert "the path is empty; give the path of a new file for the backup" in human.stderr
    assert processes_of(cli.home) == [], "nothing was sent: no server was started for it"


def test_server_commands_print_a_home_with_control_characters_escaped() -> None:
    """PIWF_HOME is printed by server start, status and stop: a terminal escape in it shows
    as its Python escape, never raw."""
    root = Path(tempfile.mkdtemp(prefix="pf", dir="/tmp"))
    cli = Piwf(root / "h\x1b]0;x\x07")
    shown = str(root / "h\\x1b]0;x\\x07")
    try:
        assert cli.run("server", "status").stdout == f"no piwf server is running for {shown}\n"
        started = cli.run("server", "start").stdout
        assert started.startswith("started piwf server (pid ") and started.endswith(
            f") for {shown}\n"
        ), started
        again = cli.run("server", "start").stdout
        assert again.startswith("piwf server already running (epoch ") and again.endswith(
            f") for {shown}\n"
        ), again
        assert cli.run("server", "stop").stdout == "piwf server stopped\n"
        assert cli.run("server", "stop").stdout == f"no piwf server is running for {shown}\n"
    finally:
        with contextlib.suppress(subprocess.TimeoutExpired):
            cli.run("server", "stop")
        subprocess.run(["rm", "-rf", str(root)], check=True)


def test_backup_to_an_existing_path_is_a_usage_error_before_anything_is_sent(
    cli: Piwf, tmp_path: Path
) -> None:
    """As `state prune --backup` refuses it: exit 2, the path named (escaped), no server."""
    taken = tmp_path / "taken\x1b[31m.sqlite"
    taken.write_bytes(b"kept")
    refused = cli.json("state", "backup", str(taken), exit_code=2)
    escaped = str(tmp_path / "taken\\x1b[31m.sqlite")
    assert refused["error"] == {
        "code": "usage",
        "message": f"{escaped} already exists; choose a new file",
    }
    human = cli.run("state", "backup", str(taken))
    assert human.returncode == 2
    assert human.stderr.endswith(f"Error: {escaped} already exists; choose a new file\n")
    assert "\x1b" not in human.stderr
    assert taken.read_bytes() == b"kept"
    assert processes_of(cli.home) == [], "nothing was sent: no server was started for it"


def test_a_backup_path_that_names_a_directory_is_a_usage_error(cli: Piwf, tmp_path: Path) -> None:
    """`DIR/` (or `DIR/.`) for a directory that does not exist yet: as a Path it loses its
    ending, and the backup became a file named DIR."""
    for typed in (f"{tmp_path}/newdir/", f"{tmp_path}/newdir/."):
        refused = cli.json("state", "backup", typed, exit_code=2)
        assert refused["error"]["code"] == "usage"
        assert refused["error"]["message"].startswith(f"{typed} names a directory; give the path")
        pruned = cli.json(
            "state", "prune", "--before", "2024-05-01", "--backup", typed, "--apply", exit_code=2
        )
        assert pruned["error"]["message"].startswith(f"--backup {typed} names a directory")
    assert list(tmp_path.iterdir()) == []
    assert processes_of(cli.home) == [], "nothing was sent: no server was started for it"


def test_a_backup_named_like_the_live_databases_journal_is_refused(cli: Piwf) -> None:
    """SQLite takes `state.sqlite-journal` for the live database's hot journal and deletes
    it at the next open: such a backup was reported written, then vanished."""
    start_hello(cli, "Ada")
    journal = cli.home / "state.sqlite-journal"
    refused = cli.json("state", "backup", str(journal), exit_code=1)
    assert refused["error"]["code"] == "backupFailed", refused
    message = refused["error"]["message"]
    assert message.startswith(f"backup to {journal} failed: the backup destination is named")
    assert "journal of the live database (state.sqlite-journal)" in message
    assert not journal.exists()
    assert sorted(p.name for p in cli.home.iterdir() if p.name.startswith(".piwf-backup")) == []
    kept = cli.home / "state.sqlite-journal.sqlite"  # any other name in the home is fine
    assert cli.json("state", "backup", str(kept))["destination"] == str(kept)


PRINTS = """
from piwf.workflow import compute, define_workflow

workflow = define_workflow(
    name="prints",
    start_at="talk",
    nodes={"talk": compute(lambda ctx: print("talk says hello") or {"n": 1})},
    edges=[],
)
"""


def test_run_logs_of_a_restored_home_say_the_log_file_is_missing(cli: Piwf, tmp_path: Path) -> None:
    workflow = tmp_path / "prints.py"
    workflow.write_text(PRINTS)
    run = cli.json("run", "start", str(workflow), "--wait")["run"]
    assert run["status"] == "completed"
    (attempt,) = cli.json("run", "logs", run["runId"])["attempts"]
    said = "talk says hello\n"
    assert (attempt["text"], attempt["keptBytes"], attempt["missing"]) == (said, len(said), False)
    backup = tmp_path / "backup.sqlite"
    cli.json("state", "backup", str(backup))
    assert cli.json("server", "stop")["wasRunning"] is True

    # The backup restored on another home: the database comes, the logs directory does not.
    with piwf_home() as other:
        other.json("state", "restore", str(backup))
        assert not (other.home / "logs").exists()
        (restored,) = other.json("run", "logs", run["runId"])["attempts"]
        assert (restored["text"], restored["keptBytes"]) == ("", len(said))
        assert restored["missing"] is True
        shown = other.run("run", "logs", run["runId"])
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout == (
            f"== talk (visit 1, attempt 1) completed: stdout {len(said)} B; its log file is "
            "missing (backups hold the database, not the logs directory) ==\n"
        )
        other.run("server", "stop")


# -- JSON arguments at the protocol's value limits --------------------------------------------

REFUSED_INPUTS = {
    '{"n": 9007199254740992}': "unsafeInteger",
    '{"n": 9007199254740993}': "unsafeInteger",
    '{"n": -9007199254740992}': "unsafeInteger",
    '{"n": 100000000000000000000}': "unsafeInteger",
    '{"n": 1e400}': "nonFinite",
    '{"n": NaN}': "nonFinite",
    '{"n": Infinity}': "nonFinite",
    '{"n": 1, "n": 2}': "duplicateKey",
    '{"s": "\\ud800"}': "loneSurrogate",
}


def test_cli_json_arguments_beyond_the_protocol_are_usage_errors_before_anything_is_sent(
    cli: Piwf, tmp_path: Path
) -> None:
    accepted = cli.json("run", "start", HELLO, "--input", f'{{"who": "x", "n": {MAX_SAFE}}}')
    assert accepted["run"]["status"] == "queued"
    before = run_ids(cli)
    for text, reason in REFUSED_INPUTS.items():
        result = cli.run("run", "start", HELLO, "--input", text)
        assert result.returncode == 2, (text, result.stderr)
        assert f"not valid JSON for piwf ({reason})" in result.stderr, (text, result.stderr)
        assert "Invalid value for --input: " in result.stderr
    spec_file = tmp_path / "bad.json"
    cases: list[tuple[list[str], str]] = [
        (["answer", "req-1", '{"choice": 9007199254740992}'], "for RESPONSE_JSON:"),
        (["resource", "apply", "m", "k", "--spec", '{"n": 9007199254740992}'], "for --spec:"),
        (["run", "start", HELLO, "--input-file", str(spec_file)], "for --input-file:"),
        (["resource", "apply", "m", "k", "--spec-file", str(spec_file)], "for --spec-file:"),
    ]
    spec_file.write_bytes(b'{"n": -9007199254740992}')
    for args, hint in cases:
        result = cli.run(*args, "--json")
        assert result.returncode == 2, (args, result.stdout)
        error = json.loads(result.stdout)["error"]
        assert error["code"] == "usage"
        assert "unsafeInteger" in error["message"] and hint in error["message"], error
    spec_file.write_bytes(b'{"s": "\xed\xa0\x80"}')  # a UTF-8-encoded lone surrogate
    result = cli.run("run", "start", HELLO, "--input-file", str(spec_file))
    assert result.returncode == 2 and "badEncoding" in result.stderr
    # b'\xff' typed into an argument: Python hands it over as the surrogate U+DCFF
    result = cli.run("answer", "req-1", '{"choice": "\udcff"}', "--json")
    assert result.returncode == 2, result.stdout
    assert "not valid JSON for piwf (badEncoding)" in json.loads(result.stdout)["error"]["message"]
    assert run_ids(cli) == before, "a refused argument started a run"


def test_a_restore_interrupted_after_moving_the_database_is_finished_by_running_it_again(
    stopped_home: Piwf, tmp_path: Path
) -> None:
    # The state a crash right after the first move leaves: the database is aside, its -wal
    # and -shm are not. piwf refuses that home (never the old WAL mixed into a new file), and a
    # second restore moves the rest aside and installs the backup.
    cli = stopped_home
    source = tmp_path / "src"
    source.mkdir(mode=0o700)
    make_database(source / "state.sqlite", projects=2)
    database = cli.home / "state.sqlite"
    database.rename(cli.home / "state.sqlite.replaced-20240501T120000Z")
    assert wal_of(database).exists()

    refused = cli.json("server", "start", exit_code=1)
    assert refused["error"]["code"] == "incompatibleState", "the refusal keeps its own code"
    message = refused["error"]["message"]
    assert "state.sqlite-wal exists without state.sqlite: an interrupted `piwf state restore`" in (
        message
    ), "the refusal says what most likely happened and how to finish"
    assert "move state.sqlite together" not in message, "no advice about a file that is gone"

    report = cli.json("state", "restore", str(source / "state.sqlite"))
    moved = sorted(Path(item["from"]).name for item in report["movedAside"])
    assert moved == ["state.sqlite-shm", "state.sqlite-wal"]
    assert database.read_bytes() == (source / "state.sqlite").read_bytes()
    assert cli.json("server", "start")["started"] is True
    assert cli.json("state", "verify") == {"valid": True, "violations": []}


def test_a_backup_restored_into_another_home_starts_while_its_source_server_runs(
    cli: Piwf, tmp_path: Path
) -> None:
    start_hello(cli, "Ada")  # its server runs, and is recorded as the owner in every backup
    backup = tmp_path / "backup.sqlite"
    cli.json("state", "backup", str(backup))
    with piwf_home() as other:
        other.json("state", "restore", str(backup))
        # The recorded owner is alive but serves the source home's file, not this copy.
        started = other.json("run", "start", HELLO, "--input", '{"who": "Bo"}', "--wait")
        assert started["run"]["status"] == "completed"
        listed = {run["runId"] for run in other.json("run", "list")["runs"]}
        assert listed >= {r["runId"] for r in cli.json("run", "list")["runs"]}
    # The source home's server was left alone and still answers.
    assert cli.json("server", "status")["state"] == "running"
