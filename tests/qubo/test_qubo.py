"""BlockQUBO: energies against explicit sums, constraints, files, dimod and qiskit conversions."""

import itertools

import dimod
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from cbo import BlockQUBO, CorruptFileError, InfeasibleError, InvalidQUBOError
from cbo.qubo.instances import random_block_qubo


def explicit_energy(H, g, x):
    n = len(x)
    return 0.5 * sum(H[i][j] * x[i] * x[j] for i in range(n) for j in range(n)) - sum(g[i] * x[i] for i in range(n))


def sym(n, seed):
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(n, n))
    return (A + A.T) / 2, rng.normal(size=n)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 7), st.integers(0, 10_000), st.data())
def test_energy_matches_explicit_sum(n, seed, data):
    H, g = sym(n, seed)
    q = BlockQUBO(H, g)
    X = data.draw(arrays(np.uint8, (5, n), elements=st.integers(0, 1)))
    E = q.energy(X)
    for b in range(5):
        assert E[b] == pytest.approx(explicit_energy(H, g, X[b]), abs=1e-9)
        assert q.energy(X[b]) == pytest.approx(E[b])


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.integers(0, 10_000))
def test_qubo_matrix_form_equals_energy(n, seed):
    H, g = sym(n, seed)
    q = BlockQUBO(H, g, offset=0.5)
    Q = q.qubo_matrix()
    for bits in itertools.product([0, 1], repeat=n):
        x = np.array(bits)
        e = sum(Q[i, i] * x[i] for i in range(n)) + sum(
            Q[i, j] * x[i] * x[j] for i in range(n) for j in range(i + 1, n)
        )
        assert q.energy(x) == pytest.approx(e + 0.5, abs=1e-9)


def test_from_plain_qubo_matrix():
    rng = np.random.default_rng(3)
    Q = np.triu(rng.normal(size=(5, 5)))
    q = BlockQUBO.from_qubo_matrix(Q)
    for bits in itertools.product([0, 1], repeat=5):
        x = np.array(bits, dtype=float)
        assert q.energy(x) == pytest.approx(x @ Q @ x, abs=1e-9)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 6), st.integers(0, 10_000), st.integers(0, 6))
def test_feasibility_matches_definition(n, seed, m):
    rng = np.random.default_rng(seed)
    H, g = sym(n, seed)
    kinds = [["attention", "mlp"][i % 2] for i in range(n)]
    sizes = rng.integers(1, 10, size=n)
    keep = [0] if n > 2 else []
    force = [n - 1] if n > 3 else []
    q = BlockQUBO(
        H, g, kinds=kinds, sizes=sizes, keep=keep, force=force, caps={"mlp": 1} if n > 1 else {}, max_removed_params=15
    )
    X = np.array(list(itertools.product([0, 1], repeat=n)), dtype=np.uint8)
    got = q.feasible(X, m)
    for x, ok in zip(X, got):
        want = (
            x.sum() == m
            and all(x[i] == 0 for i in keep)
            and all(x[i] == 1 for i in force)
            and sum(x[i] for i in range(n) if kinds[i] == "mlp") <= 1
            and int(x @ sizes) <= 15
        )
        assert bool(ok) == bool(want)


def test_bad_matrices_are_refused_with_clear_errors():
    with pytest.raises(InvalidQUBOError, match="square"):
        BlockQUBO(np.zeros((2, 3)))
    with pytest.raises(InvalidQUBOError, match="not symmetric"):
        BlockQUBO(np.array([[0.0, 1.0], [0.0, 0.0]]))
    q = BlockQUBO(np.array([[0.0, 1.0], [0.0, 0.0]]), symmetrize=True)
    assert q.energy([1, 1]) == pytest.approx(0.5)
    with pytest.raises(InvalidQUBOError, match="nan"):
        BlockQUBO(np.array([[np.nan]]))
    with pytest.raises(InvalidQUBOError, match="inf"):
        BlockQUBO(np.eye(2), [np.inf, 0])
    with pytest.raises(InvalidQUBOError, match="g has shape"):
        BlockQUBO(np.eye(2), [1.0, 2.0, 3.0])
    with pytest.raises(InvalidQUBOError, match="unique"):
        BlockQUBO(np.eye(2), names=["a", "a"])
    with pytest.raises(InvalidQUBOError, match="no block named"):
        BlockQUBO(np.eye(2), keep=["zzz"])


def test_constraint_errors_name_the_problem():
    q = BlockQUBO(np.eye(4), kinds=["a", "a", "b", "b"], keep=[0])
    with pytest.raises(InfeasibleError, match="0..3"):
        q.check_remove(4)
    with pytest.raises(InfeasibleError, match="0..3"):
        q.check_remove(-1)
    with pytest.raises(InfeasibleError, match="both kept and forced"):
        BlockQUBO(np.eye(3), keep=[1], force=[1])
    with pytest.raises(InfeasibleError, match="caps"):
        q.with_constraints(caps={"a": 0, "b": 1}).check_remove(2)
    with pytest.raises(InfeasibleError, match="forced"):
        BlockQUBO(np.eye(3), force=[0, 1]).check_remove(1)
    with pytest.raises(InfeasibleError, match="max_removed_params"):
        BlockQUBO(np.eye(3), sizes=[5, 6, 7], max_removed_params=10).check_remove(2)
    with pytest.raises(InfeasibleError, match="min_removed_params"):
        BlockQUBO(np.eye(3), sizes=[5, 6, 7], min_removed_params=20).check_remove(2)
    with pytest.raises(InvalidQUBOError, match="kind"):
        q.with_constraints(caps={"zzz": 1})


def test_save_load_roundtrip_and_corruption(tmp_path):
    q = random_block_qubo(12, seed=4).with_constraints(keep=[0], force=[3], max_removed_params=9)
    p = q.save(tmp_path / "q.cboq")
    r = BlockQUBO.load(p)
    np.testing.assert_array_equal(r.H, q.H)
    np.testing.assert_array_equal(r.g, q.g)
    assert r.names == q.names and r.kinds == q.kinds
    assert r.constraints == q.constraints and r.metadata == q.metadata
    data = p.read_bytes()
    (tmp_path / "trunc.cboq").write_bytes(data[: len(data) // 2])
    with pytest.raises(CorruptFileError, match="truncated"):
        BlockQUBO.load(tmp_path / "trunc.cboq")
    # edit one array inside the archive: the checksum must catch it
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(p) as zin, zipfile.ZipFile(buf, "w") as zout:
        for item in zin.namelist():
            content = zin.read(item)
            if item == "g.npy":
                arr = np.load(io.BytesIO(content))
                arr[0] += 1.0
                b = io.BytesIO()
                np.save(b, arr)
                content = b.getvalue()
            zout.writestr(item, content)
    (tmp_path / "edited.cboq").write_bytes(buf.getvalue())
    with pytest.raises(CorruptFileError, match="checksum"):
        BlockQUBO.load(tmp_path / "edited.cboq")
    with pytest.raises(CorruptFileError, match="no QUBO file"):
        BlockQUBO.load(tmp_path / "missing.cboq")


@pytest.mark.parametrize("seed", range(5))
def test_bqm_penalty_keeps_feasible_minimum(seed):
    q = random_block_qubo(8, seed=seed).with_constraints(keep=[0], force=[5])
    m = 3
    bqm = q.to_bqm(m)
    X = np.array(list(itertools.product([0, 1], repeat=q.n)), dtype=np.uint8)
    labels = list(q.names)
    E_bqm = np.array([bqm.energy(dict(zip(labels, x))) for x in X])
    feas = q.feasible(X, m)
    # on feasible states the BQM energy equals the QUBO energy
    np.testing.assert_allclose(E_bqm[feas], q.energy(X[feas]), atol=1e-9)
    # the safe penalty makes the global BQM minimum feasible
    assert feas[np.argmin(E_bqm)]
    assert E_bqm[~feas].min() > E_bqm[feas].min()


def test_from_bqm_roundtrip():
    bqm = dimod.BinaryQuadraticModel(
        {"a": 1.0, "b": -2.0, "c": 0.5}, {("a", "b"): 3.0, ("b", "c"): -1.0}, 0.25, "BINARY"
    )
    q = BlockQUBO.from_bqm(bqm)
    for bits in itertools.product([0, 1], repeat=3):
        sample = dict(zip("abc", bits))
        assert q.energy(np.array(bits)) == pytest.approx(bqm.energy(sample))
    spin = bqm.change_vartype("SPIN", inplace=False)
    q2 = BlockQUBO.from_bqm(spin)
    for bits in itertools.product([0, 1], repeat=3):
        assert q2.energy(np.array(bits)) == pytest.approx(bqm.energy(dict(zip("abc", bits))))


def test_quadratic_program_has_native_constraints():
    pytest.importorskip("qiskit_optimization")
    q = random_block_qubo(6, seed=2).with_constraints(keep=[0], force=[1])
    qp = q.to_quadratic_program(3)
    assert qp.get_num_binary_vars() == 6
    names = {c.name for c in qp.linear_constraints}
    assert {"remove_M", "keep_0", "force_1"} <= names
    x = np.array([0, 1, 1, 0, 1, 0])
    assert qp.objective.evaluate(x) == pytest.approx(q.energy(x))
    assert qp.is_feasible(x)
    assert not qp.is_feasible(np.array([1, 1, 1, 0, 0, 0]))


def test_random_instance_is_deterministic_and_shaped():
    a, b = random_block_qubo(20, seed=7), random_block_qubo(20, seed=7)
    np.testing.assert_array_equal(a.H, b.H)
    assert not np.array_equal(a.H, random_block_qubo(20, seed=8).H)
    h = random_block_qubo(20, seed=7, heavy_ends=True)
    assert h.linear[0] > h.linear[1:-1].max() and h.linear[-1] > h.linear[1:-1].max()
