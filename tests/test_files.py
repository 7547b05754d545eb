"""cbo.files: the one checkpoint writer and the atomic saves: a write that fails half-way (a full disk, a kill)
leaves the previous file whole and no temporary file behind."""

from __future__ import annotations

import os

import numpy as np
import pytest

import cbo.files
from cbo.files import CheckpointFile
from cbo.hessian.checkpoint import Checkpoint as HessianCheckpoint
from cbo.measure.executors import SearchCheckpoint
from cbo.qubo.states import RankedStates


def _failing_rename(monkeypatch):
    def fail(src, dst):
        raise OSError("No space left on device")

    monkeypatch.setattr(cbo.files.os, "replace", fail)


def test_a_checkpoint_round_trips_and_is_deleted(tmp_path):
    ck = CheckpointFile(tmp_path / "sub" / "run.ckpt")
    assert ck.read() is None and not ck.exists()
    ck.write(b"state 1")
    ck.write(b"state 2")
    assert ck.read() == b"state 2" and ck.exists()
    ck.delete()
    assert not ck.exists() and ck.read() is None
    ck.delete()  # a second delete is fine


@pytest.mark.parametrize("kind", ["search", "hessian", "states"])
def test_a_failed_write_leaves_the_previous_file_whole(kind, tmp_path, monkeypatch):
    if kind == "search":
        ck = SearchCheckpoint(tmp_path / "s.json", {"method": "x"})
        ck.save({"round": 1})
        path, again = ck.path, lambda: ck.save({"round": 2})
        reread = ck.load
    elif kind == "hessian":
        ck = HessianCheckpoint(tmp_path, "k" * 64)
        ck.save({"H": np.eye(2)}, 1, {})
        path, again = ck.path, lambda: ck.save({"H": np.zeros((2, 2))}, 2, {})
        reread = ck.load
    else:
        states = RankedStates(np.eye(3, dtype=np.uint8), [1.0, 2.0, 3.0], names=list("abc"), remove=1, solver="t",
                              exact=True)  # fmt: skip
        path = tmp_path / "states.json"
        states.save(path)
        again = lambda: states.save(path)  # noqa: E731
        reread = lambda: RankedStates.load(path)  # noqa: E731
    before = path.read_bytes()
    _failing_rename(monkeypatch)
    with pytest.raises(OSError, match="No space left"):
        again()
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert sorted(os.listdir(path.parent)) == [path.name]  # no temporary file left
    assert reread() is not None


def test_every_checkpoint_class_uses_the_one_writer():
    from cbo.recovery.healing import Checkpoint as HealCheckpoint

    for cls in (HessianCheckpoint, SearchCheckpoint, HealCheckpoint):
        assert issubclass(cls, CheckpointFile) and "write" not in vars(cls)
