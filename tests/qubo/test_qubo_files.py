"""Damaged, foreign and hand-made ``.cboq`` files are refused with CorruptFileError, never another error."""

from __future__ import annotations

import io
import json
import zipfile

import numpy as np
import pytest

from cbo import BlockQUBO, CorruptFileError, InvalidQUBOError
from cbo.qubo.block_qubo import ARRAY_KEYS, FILE_FORMAT


def small_qubo() -> BlockQUBO:
    rng = np.random.default_rng(0)
    A = rng.normal(size=(6, 6))
    return BlockQUBO(A @ A.T, rng.normal(size=6), kinds=["attention", "mlp"] * 3, keep=[0], caps={"mlp": 2})


def rewrite(path, meta_edit=None, raw_meta=None, drop=None) -> None:
    """Rewrite an archive with edited metadata (checksum recomputed, so only the content is wrong)."""
    from cbo.files import archive_checksum

    with zipfile.ZipFile(path) as zf:
        meta = json.loads(zf.read("meta.json"))
        arrays = {k: np.load(io.BytesIO(zf.read(f"{k}.npy"))) for k in ARRAY_KEYS}
    meta.pop("sha256")
    if meta_edit:
        meta_edit(meta)
    meta["sha256"] = archive_checksum(arrays, meta)
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("meta.json", raw_meta if raw_meta is not None else json.dumps(meta))
        for k, a in arrays.items():
            if k != drop:
                b = io.BytesIO()
                np.save(b, a)
                zf.writestr(f"{k}.npy", b.getvalue())


def test_every_single_byte_flip_is_refused_or_loads_the_same_qubo(tmp_path):
    q = small_qubo()
    path = q.save(tmp_path / "q.cboq")
    data = path.read_bytes()
    assert len(data) < 4000
    damaged = tmp_path / "d.cboq"
    outcomes = {"refused": 0, "same": 0}
    for pos in range(len(data)):
        for flip in (0xFF, 0x01):
            b = bytearray(data)
            b[pos] ^= flip
            damaged.write_bytes(bytes(b))
            try:
                loaded = BlockQUBO.load(damaged)
            except CorruptFileError:
                outcomes["refused"] += 1
                continue
            # a flip in a field the format does not use (a timestamp, say) may leave the content intact
            assert np.array_equal(loaded.H, q.H) and np.array_equal(loaded.g, q.g)
            assert loaded.names == q.names and loaded.constraints == q.constraints
            outcomes["same"] += 1
    assert outcomes["refused"] > len(data)  # most flips damage something


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda m: m.update(version="2"), "version '2'"),
        (lambda m: m.update(version=99), "newer than this CBO"),
        (lambda m: m.pop("constraints"), "does not describe a valid QUBO"),
        (lambda m: m.update(names=["a"] * 6), "does not describe a valid QUBO"),
        (lambda m: m.update(constraints=[1, 2]), "does not describe a valid QUBO"),
        (lambda m: m.update(format="other"), "has format 'other'"),
    ],
)
def test_forged_metadata_with_a_valid_checksum_is_refused(tmp_path, edit, message):
    path = small_qubo().save(tmp_path / "q.cboq")
    rewrite(path, edit)
    with pytest.raises(CorruptFileError, match=message):
        BlockQUBO.load(path)


def test_list_shaped_metadata_and_missing_arrays_are_refused(tmp_path):
    path = small_qubo().save(tmp_path / "q.cboq")
    rewrite(path, raw_meta=json.dumps([FILE_FORMAT, 1]))
    with pytest.raises(CorruptFileError, match="expected a JSON object"):
        BlockQUBO.load(path)
    path = small_qubo().save(tmp_path / "r.cboq")
    rewrite(path, drop="g")
    with pytest.raises(CorruptFileError, match="not a readable CBO file"):
        BlockQUBO.load(path)


def test_entries_whose_energies_would_overflow_are_refused():
    H = np.full((3, 3), 1e308)
    with pytest.raises(InvalidQUBOError, match="too large"):
        BlockQUBO(H)
    with pytest.raises(InvalidQUBOError, match="too large"):
        BlockQUBO(np.eye(3), np.full(3, 1e300))
    BlockQUBO(np.eye(3) * 1e290)  # large but safe


def test_keep_takes_one_block_or_a_list_and_refuses_other_types():
    q = BlockQUBO(np.eye(4), names=["layers.0", "layers.1", "layers.2", "layers.3"])
    assert q.with_constraints(keep=3).constraints.keep == (3,)
    assert q.with_constraints(keep="layers.3").constraints.keep == (3,)
    assert q.with_constraints(keep=["layers.1", 2]).constraints.keep == (1, 2)
    with pytest.raises(InvalidQUBOError, match="must be a block index, a block name or a list"):
        q.with_constraints(keep=3.5)
    with pytest.raises(InvalidQUBOError, match="no block named 'layer.3'"):
        q.with_constraints(keep="layer.3")


def test_concurrent_saves_of_one_path_never_leave_a_broken_file(tmp_path):
    """Two writers racing on one path: each uses its own temporary name; the survivor loads intact."""
    import threading

    path = tmp_path / "shared.cboq"
    qubos = [BlockQUBO(np.eye(5) * (k + 1)) for k in range(2)]
    errors = []

    def writer(q):
        try:
            for _ in range(40):
                q.save(path)
        except Exception as exc:  # noqa: BLE001 - any failure is the bug under test
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(q,)) for q in qubos]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    loaded = BlockQUBO.load(path)
    assert any(np.array_equal(loaded.H, q.H) for q in qubos)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shared.cboq"]  # no temporary file left behind
