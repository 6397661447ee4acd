"""Federation state folders (clients/site/state_store.py): the coordinator chooses federation
ids, so no two ids may share a folder, and a plain id keeps the folder it always had (#44)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from clients.site.state_store import PLAIN_MAX, SiteStateStore, federation_folder_name


def test_a_slash_and_an_underscore_get_different_folders(tmp_path: Path):
    store = SiteStateStore(tmp_path)
    store.save("a/b", "ef-residual", np.ones(3, np.float32))
    store.save("a_b", "ef-residual", np.zeros(2, np.float32))
    assert store.folder("a/b") != store.folder("a_b")
    np.testing.assert_array_equal(store.load("a/b", "ef-residual"), np.ones(3, np.float32))
    np.testing.assert_array_equal(store.load("a_b", "ef-residual"), np.zeros(2, np.float32))


@pytest.mark.parametrize("federation", ["fed-pe-seg", "a_b", "run.42", "0a1b2c3d4e5f",
                                        ".hidden", "x" * PLAIN_MAX])
def test_a_plain_id_keeps_its_folder_name(tmp_path: Path, federation: str):
    assert SiteStateStore(tmp_path).folder(federation) == tmp_path / federation


@pytest.mark.parametrize("federation", ["a/b", "../up", "fed 1", "fed~1", "fédé", "a\\b",
                                        "x" * (PLAIN_MAX + 1)])
def test_any_other_id_is_readable_and_its_digest(federation: str):
    name = federation_folder_name(federation)
    readable, separator, digest = name.rpartition("~")
    assert separator and digest == hashlib.sha256(federation.encode()).hexdigest()[:32]
    assert "/" not in readable and "\\" not in readable and len(readable) <= 64
    assert name != federation and "~" not in readable


def test_no_id_takes_the_folder_of_an_encoded_one():
    encoded = federation_folder_name("a/b")
    lookalike = encoded.replace("~", "-")  # the plain id closest to it
    assert federation_folder_name(lookalike) == lookalike != encoded
    assert federation_folder_name(encoded) not in (encoded, "a/b")  # holds "~": encoded too


@pytest.mark.parametrize("federation", ["", ".", ".."])
def test_empty_or_dot_only_ids_are_refused(federation: str):
    with pytest.raises(ValueError, match="dot-only"):
        federation_folder_name(federation)
