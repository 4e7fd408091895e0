"""The settings structure helpers read a definition snapshot's workflow tree, mounts included."""

from __future__ import annotations

from piwf.settings_grants import mount_paths, scope_structure

SNAPSHOT = {
    "workflow": {
        "includes": {
            "review": {
                "workflow": {
                    "includes": {"lint": {"workflow": {"includes": {}}}},
                    "settings": {"paths": []},
                }
            },
            "ship": {"workflow": {"includes": {}}},
        }
    }
}


def test_mount_paths_lists_every_mount_nested_ones_as_outer_slash_inner() -> None:
    assert mount_paths(SNAPSHOT) == ["review", "review/lint", "ship"]
    assert mount_paths({"workflow": {"includes": {}}}) == []
    assert mount_paths(None) == []


def test_scope_structure_finds_a_mounted_workflows_settings_only_where_it_declares_them() -> None:
    assert scope_structure(SNAPSHOT, "review") == {"paths": []}
    assert scope_structure(SNAPSHOT, "ship") is None
    assert scope_structure(SNAPSHOT, "nowhere") is None
