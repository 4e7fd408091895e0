"""``has_file_open``: whether a recorded process holds one exact file open (a server start
uses it to tell the owner of this database from the server of the home it was copied from)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from piwf.processes import has_file_open, start_identity

#: Opens argv[1], says so, and holds it until its stdin closes.
HOLD = (
    "import sys; f = open(sys.argv[1], 'rb'); "
    "sys.stdout.write('open\\n'); sys.stdout.flush(); sys.stdin.read()"
)


def test_a_process_has_the_file_it_holds_open_not_a_copy_of_it(tmp_path: Path) -> None:
    held = tmp_path / "state.sqlite"
    held.write_bytes(b"x" * 100)
    copy = tmp_path / "copy.sqlite"
    shutil.copyfile(held, copy)
    link = tmp_path / "link.sqlite"
    link.symlink_to(held)
    with subprocess.Popen(
        [sys.executable, "-c", HOLD, str(held)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as holder:
        assert holder.stdin is not None and holder.stdout is not None
        assert holder.stdout.readline() == "open\n"
        identity = start_identity(holder.pid)
        assert identity is not None
        assert has_file_open(identity, held)
        assert has_file_open(identity, link)  # the same file by another name
        assert not has_file_open(identity, copy)  # same bytes, another file
        holder.stdin.close()
        holder.wait(timeout=10)
    assert not has_file_open(identity, held), "a process that ended holds nothing"
