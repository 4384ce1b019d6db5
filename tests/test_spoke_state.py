"""The spoke's state across restarts (``spoke/state.py``): commit membership."""

from __future__ import annotations

from spoke.state import SpokeState

COMMIT = "c" * 64


def test_commit_membership_is_kept_and_forgotten_with_its_repository(tmp_path) -> None:
    state = SpokeState(str(tmp_path))
    assert not state.has_commit("alpha", COMMIT)
    state.add_commit("alpha", COMMIT)
    state.add_commit("beta", COMMIT)
    assert state.has_commit("alpha", COMMIT) and state.has_commit("beta", COMMIT)
    state.forget_repo("alpha")  # what is kept in memory goes with the rows
    assert not state.has_commit("alpha", COMMIT) and state.has_commit("beta", COMMIT)
    again = SpokeState(str(tmp_path))  # a restart: the rows answer
    assert again.has_commit("beta", COMMIT) and not again.has_commit("alpha", COMMIT)
