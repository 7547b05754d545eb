"""What estimate_hessian does around the estimators: resumable checkpoints, the on-disk cache, errors that name
the bad value, and the registry."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from cbo.errors import CBOError, DataError, InvalidOptionError, UnknownNameError
from cbo.hessian import ESTIMATORS, driver, estimate_hessian, names
from cbo.hessian import base as hbase
from cbo.hessian.checkpoint import Checkpoint
from cbo.measure.measurer import Measurer
from cbo.qubo.block_qubo import BlockQUBO


class Interrupt(Exception):
    pass


def _stop_after(batch):
    def callback(b, state):
        if b == batch:
            raise Interrupt(f"stopped after batch {b}")

    return callback


@pytest.mark.parametrize(
    "estimator, options",
    [("fisher", {}), ("fisher", {"labels": "empirical"}), ("exact", {}), ("pairwise", {"couplings": "raw"})],
)
def test_interrupted_and_resumed_equals_uninterrupted(tiny_model, tiny_windows, tmp_path, estimator, options):
    model = tiny_model("llama", n_layers=3)
    windows = tiny_windows(model, n=6, seq_len=10)
    kw = dict(estimator=estimator, loss="ce", batch_size=2, progress=False, **options)
    whole = estimate_hessian(model, None, windows, **kw)
    ckpt = tmp_path / "ckpt"
    with pytest.raises(Interrupt):
        estimate_hessian(model, None, windows, checkpoint=ckpt, callback=_stop_after(1), **kw)
    files = list(ckpt.glob("*.ckpt.npz"))
    assert len(files) == 1
    seen = []
    resumed = estimate_hessian(model, None, windows, checkpoint=ckpt, callback=lambda b, s: seen.append(b), **kw)
    assert seen == [2]  # only the third batch was computed again
    assert resumed.metadata["resumed_from_batch"] == 2
    np.testing.assert_array_equal(resumed.H, whole.H)
    np.testing.assert_array_equal(resumed.g, whole.g)
    assert resumed.metadata["forward_passes"] == whole.metadata["forward_passes"]
    assert not list(ckpt.glob("*.ckpt.npz"))  # a finished run deletes its checkpoint


def test_a_checkpoint_of_another_run_is_ignored(tiny_model, tiny_windows, tmp_path):
    model = tiny_model("llama", n_layers=3)
    windows = tiny_windows(model, n=4, seq_len=10)
    kw = dict(estimator="fisher", batch_size=2, progress=False, checkpoint=tmp_path)
    with pytest.raises(Interrupt):
        estimate_hessian(model, None, windows, loss="kl", callback=_stop_after(0), **kw)
    q = estimate_hessian(model, None, windows, loss="ce", **kw)  # other loss: other key, starts at 0
    assert q.metadata["resumed_from_batch"] == 0
    ck = Checkpoint(tmp_path, "x" * 64)
    ck.path.write_bytes(b"not a checkpoint")
    with pytest.warns(UserWarning, match="unreadable checkpoint"):
        assert ck.load() is None


def test_a_damaged_checkpoint_is_ignored_and_the_estimate_starts_over(tiny_model, tiny_windows, tmp_path):
    """A checkpoint truncated or with bytes flipped (a Ctrl-C, a full disk): a warning naming it, then the estimate
    starts over and equals an uninterrupted one (issue 27: it raised zipfile.BadZipFile)."""
    model = tiny_model("llama", n_layers=3)
    windows = tiny_windows(model, n=4, seq_len=10)
    kw = dict(estimator="fisher", loss="kl", batch_size=2, progress=False)
    whole = estimate_hessian(model, None, windows, **kw)
    with pytest.raises(Interrupt):
        estimate_hessian(model, None, windows, callback=_stop_after(0), checkpoint=tmp_path, **kw)
    (path,) = tmp_path.glob("*.ckpt.npz")
    good = path.read_bytes()
    flipped = bytearray(good)
    flipped[40:200] = bytes(reversed(flipped[40:200]))
    for damaged in (good[: len(good) // 2], bytes(flipped), good[:30]):
        path.write_bytes(damaged)
        with pytest.warns(UserWarning, match=f"ignoring unreadable checkpoint '{path}'"):
            q = estimate_hessian(model, None, windows, checkpoint=tmp_path, **kw)
        assert q.metadata["resumed_from_batch"] == 0
        np.testing.assert_allclose(q.H, whole.H, rtol=1e-6)


def test_cache_returns_the_stored_qubo_and_keys_on_model_data_and_options(tiny_model, tiny_windows, tmp_path):
    model = tiny_model("llama", n_layers=3)
    windows = tiny_windows(model, n=4, seq_len=10)
    kw = dict(estimator="fisher", loss="kl", batch_size=2, progress=False, cache_dir=tmp_path)
    first = estimate_hessian(model, None, windows, **kw)
    assert len(list(tmp_path.glob("*.cboq"))) == 1

    def must_not_run(b, state):
        raise AssertionError("the cached result should have been used")

    again = estimate_hessian(model, None, windows, callback=must_not_run, **kw)
    np.testing.assert_array_equal(again.H, first.H)
    assert again.metadata == first.metadata
    estimate_hessian(model, None, windows, samples=2, **kw)  # other options
    estimate_hessian(model, None, windows[:2], **kw)  # other data
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.mul_(1.5)  # other weights, same config
    estimate_hessian(model, None, windows, **kw)
    assert len(list(tmp_path.glob("*.cboq"))) == 4


def test_a_cached_qubo_of_an_earlier_version_reports_its_cost_as_fpe(tiny_model, tiny_windows, tmp_path):
    """QUBOs cached before the cost unit had one name record "forward_equivalents": read back, it is "fpe"."""
    model = tiny_model("llama", n_layers=3)
    windows = tiny_windows(model, n=4, seq_len=10)
    kw = dict(estimator="fisher", loss="kl", batch_size=2, progress=False, cache_dir=tmp_path)
    first = estimate_hessian(model, None, windows, **kw)
    (path,) = tmp_path.glob("*.cboq")
    old = BlockQUBO.load(path)
    old.metadata["forward_equivalents"] = old.metadata.pop("fpe")
    old.save(path)
    again = estimate_hessian(model, None, windows, **kw)
    assert again.metadata["fpe"] == first.metadata["fpe"] and "forward_equivalents" not in again.metadata


def test_cache_dir_that_is_not_writable_is_a_clear_error(tiny_model, tiny_windows, tmp_path):
    model = tiny_model("llama", n_layers=2)
    windows = tiny_windows(model, n=2, seq_len=8)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(CBOError, match="not writable") as info:
        estimate_hessian(model, None, windows, cache_dir=blocker / "cache", progress=False)
    assert str(blocker) in str(info.value)
    with pytest.raises(CBOError, match="checkpoint directory .* not writable"):
        estimate_hessian(model, None, windows, checkpoint=blocker, progress=False)
    assert "--no-cache" in str(info.value)  # the way out for a read-only CBO_HOME (issue 27)


def test_a_folder_at_the_cache_path_is_refused_before_the_work(tiny_model, tiny_windows, tmp_path):
    """A folder where the cached Hessian (or its checkpoint) goes: CacheDirError naming it and what to move, before
    any batch is computed (issue 27: it warned "recomputing it", computed, then died with IsADirectoryError)."""
    model = tiny_model("llama", n_layers=2)
    windows = tiny_windows(model, n=2, seq_len=8)
    kw = dict(estimator="fisher", loss="kl", batch_size=2, progress=False)
    estimate_hessian(model, None, windows, cache_dir=tmp_path / "cache", **kw)
    (path,) = (tmp_path / "cache").glob("*.cboq")
    path.unlink()
    path.mkdir()

    def no_work(b, state):
        raise AssertionError("the work started although the cache path is a folder")

    with pytest.raises(CBOError, match=f"'{path}' is a folder.*Move or delete it.*--no-cache"):
        estimate_hessian(model, None, windows, cache_dir=tmp_path / "cache", callback=no_work, **kw)
    path.rmdir()
    ckpt = Checkpoint(tmp_path / "ckpt", "y" * 64).path
    ckpt.mkdir()
    with pytest.raises(CBOError, match=f"'{ckpt}' is a folder.*Move or delete it"):
        Checkpoint(tmp_path / "ckpt", "y" * 64)


@pytest.mark.parametrize("estimator", ["fisher", "exact", "pairwise"])
def test_non_finite_loss_names_the_batch(tiny_model, tiny_windows, estimator):
    model = tiny_model("llama", n_layers=2)
    windows = tiny_windows(model, n=6, seq_len=8) % 100 + 10  # ids 10..109
    windows[3, 4] = 5  # only batch 1 (sequences 2-3) holds token 5
    with torch.no_grad():
        model.get_input_embeddings().weight[5] = float("nan")
    with pytest.raises(DataError, match="batch 1 "):
        estimate_hessian(model, None, windows, estimator=estimator, batch_size=2, progress=False)


def test_bad_input_is_refused_with_the_valid_choices(tiny_model, tiny_windows):
    model = tiny_model("llama", n_layers=2)
    windows = tiny_windows(model, n=2, seq_len=8)
    run = dict(progress=False)
    with pytest.raises(UnknownNameError, match="unknown estimator 'newton'; registered: .*'fisher'"):
        estimate_hessian(model, None, windows, estimator="newton", **run)
    with pytest.raises(InvalidOptionError, match="unknown loss 'mse'"):
        estimate_hessian(model, None, windows, loss="mse", **run)
    with pytest.raises(
        InvalidOptionError, match=r"no option\(s\) \['lables'\]; valid options: \['labels', 'samples'\]"
    ):
        estimate_hessian(model, None, windows, lables="empirical", **run)
    with pytest.raises(InvalidOptionError, match="'sampled' or 'empirical'"):
        estimate_hessian(model, None, windows, labels="true", **run)
    with pytest.raises(InvalidOptionError, match="couplings must be 'raw' or 'positive'"):
        estimate_hessian(model, None, windows, estimator="pairwise", couplings="negative", **run)
    with pytest.raises(InvalidOptionError, match="batch_size"):
        estimate_hessian(model, None, windows, batch_size=0, **run)
    with pytest.raises(DataError, match="shape"):
        estimate_hessian(model, None, windows[0], **run)
    with pytest.raises(DataError, match="integer"):
        estimate_hessian(model, None, windows.float(), **run)
    with pytest.raises(DataError, match="different tokenizer"):
        estimate_hessian(model, None, windows + 1000, **run)
    with pytest.raises(DataError, match="no calibration windows"):
        estimate_hessian(model, None, None, **run)


def test_nested_lists_and_token_splits_are_accepted(tiny_model, tiny_windows):
    from cbo.data.windows import TokenSplits

    model = tiny_model("gpt2", n_layers=2)
    windows = tiny_windows(model, n=2, seq_len=8)
    a = estimate_hessian(model, None, windows.tolist(), labels="empirical", progress=False)
    splits = TokenSplits(windows, windows[:1], windows[:1], {})
    b = estimate_hessian(model, None, splits, labels="empirical", progress=False)
    np.testing.assert_array_equal(a.H, b.H)


def test_a_new_estimator_is_one_registered_class(tiny_model, tiny_windows, monkeypatch):
    # registered into a copy of the registry's table, so the test estimator does not outlive the test
    monkeypatch.setattr(ESTIMATORS, "_entries", dict(ESTIMATORS._entries))

    @hbase.register
    class DiagonalFisher(hbase.Estimator):
        """A test-only variant: the diagonal of the empirical Fisher."""

        name = "test-diagonal"

        @dataclass
        class Options:
            damping: float = 0.0

        def init_state(self):
            return {"sq": np.zeros(len(self.run.blocks)), "count": np.zeros(())}

        def accumulate(self, state, batch_index, tokens, tick):
            from cbo.measure.losses import ce_per_sequence

            with torch.enable_grad(), self.run.gates.recording() as rec:
                ce = ce_per_sequence(self.run.forward(tokens), tokens)
                torch.autograd.grad(ce.sum(), self.run.gates.a)
            state["sq"] += (rec.value.numpy() ** 2).sum(0)
            state["count"] += tokens.shape[0]
            tick()

        def finalize(self, state):
            T = self.run.seq_len - 1
            return np.diag(T * state["sq"] / state["count"] + self.options.damping), np.zeros(len(state["sq"])), {}

    assert "test-diagonal" in names()
    model = tiny_model("llama", n_layers=3)
    windows = tiny_windows(model, n=4, seq_len=8)
    q = estimate_hessian(model, None, windows, estimator="test-diagonal", progress=False, damping=0.5)
    full = estimate_hessian(model, None, windows, labels="empirical", progress=False)
    np.testing.assert_allclose(np.diag(q.H), np.diag(full.H) + 0.5, rtol=1e-6)
    assert q.metadata["estimator"] == "test-diagonal" and q.metadata["options"] == {"damping": 0.5}
    assert q.metadata["forward_passes"] == 1 and q.metadata["fpe"] == 1.0


def test_registry_lists_the_builtin_estimators():
    assert {"fisher", "exact", "pairwise"} <= set(names())
    info = hbase.describe()
    assert "backward" in info["fisher"]["cost"] and info["pairwise"]["losses"] == "kl, ce"


def test_progress_bar_runs(tiny_model, tiny_windows, capsys):
    model = tiny_model("llama", n_layers=2)
    windows = tiny_windows(model, n=2, seq_len=8)
    estimate_hessian(model, None, windows, estimator="pairwise", progress=True)
    assert "hessian[pairwise/kl]" in capsys.readouterr().err


def test_pairwise_interrupted_inside_a_batch_resumes_where_it_stopped(tiny_model, tiny_windows, tmp_path, monkeypatch):
    """One pairwise batch is 1 + N(N+1)/2 measured sets: the sets measured before an interruption are kept."""
    model = tiny_model("llama", n_layers=3)
    windows = tiny_windows(model, n=4, seq_len=10)
    kw = dict(estimator="pairwise", loss="kl", batch_size=2, progress=False, couplings="raw")
    whole = estimate_hessian(model, None, windows, **kw)
    monkeypatch.setattr(driver, "PARTIAL_SAVE_INTERVAL_S", 0.0)
    real = Measurer.losses
    asked = []

    def interrupted(self, sets, windows=None):
        asked.append(list(sets))
        # batch 0: the original pass and 3 chunks; batch 1: the original pass, the chunks of blocks 0 and 1, then stop
        if len(asked) == 4 + 4:
            raise Interrupt("stopped inside batch 1")
        return real(self, sets, windows)

    ckpt = tmp_path / "ckpt"
    monkeypatch.setattr(Measurer, "losses", interrupted)
    with pytest.raises(Interrupt):
        estimate_hessian(model, None, windows, checkpoint=ckpt, **kw)
    (path,) = ckpt.glob("*.ckpt.npz")
    with np.load(path) as z:
        assert float(z["state__cursor"]) == 5.0  # (0,), (0,1), (0,2), (1,), (1,2)
    asked.clear()

    def counting(self, sets, windows=None):
        asked.append(list(sets))
        return real(self, sets, windows)

    monkeypatch.setattr(Measurer, "losses", counting)
    resumed = estimate_hessian(model, None, windows, checkpoint=ckpt, **kw)
    assert asked == [[()], [(2,)]]  # batch 1's original pass again, then only its unmeasured chunk
    assert resumed.metadata["resumed_from_batch"] == 1
    np.testing.assert_allclose(resumed.H, whole.H, rtol=1e-12, atol=1e-12)
    assert not list(ckpt.glob("*.ckpt.npz"))


def test_a_poisoned_cache_file_is_not_used(tiny_model, tiny_windows, tmp_path):
    """A QUBO of another model copied over the cache path, or a damaged file there, is recomputed with a warning
    naming the file; the recomputed result replaces it."""
    from cbo.qubo.instances import random_block_qubo

    model = tiny_model("llama", n_layers=3)
    windows = tiny_windows(model, n=4, seq_len=10)
    kw = dict(estimator="fisher", loss="kl", batch_size=2, progress=False, cache_dir=tmp_path)
    reference = estimate_hessian(model, None, windows, **kw)
    (path,) = tmp_path.glob("*.cboq")
    poisons = {
        "a synthetic QUBO of another size": random_block_qubo(5, 0),
        "a QUBO with the right blocks but another model": BlockQUBOWith(
            reference, model_fingerprint="0" * 16, cache_key=None
        ),
        "a QUBO whose record names another run": BlockQUBOWith(reference, cache_key="f" * 64),
    }
    for label, poison in poisons.items():
        poison.save(path)
        with pytest.warns(UserWarning, match=f"ignoring the cached Hessian '{path}'.*recomputing") as record:
            q = estimate_hessian(model, None, windows, **kw)
        assert len(record) >= 1, label
        np.testing.assert_array_equal(q.H, reference.H)
        assert q.metadata["cache_key"] == reference.metadata["cache_key"]
        again = estimate_hessian(model, None, windows, callback=_must_not_run, **kw)  # replaced: used again
        np.testing.assert_array_equal(again.H, reference.H)
    path.write_bytes(path.read_bytes()[:100])  # damaged
    with pytest.warns(UserWarning, match="ignoring the damaged cached Hessian"):
        q = estimate_hessian(model, None, windows, **kw)
    np.testing.assert_array_equal(q.H, reference.H)


def _must_not_run(b, state):
    raise AssertionError("the cached result should have been used")


def BlockQUBOWith(qubo, **metadata):
    """A copy of ``qubo`` whose metadata entries are replaced (None removes one)."""
    from cbo.qubo.block_qubo import BlockQUBO

    meta = {**qubo.metadata, **{k: v for k, v in metadata.items() if v is not None}}
    for k, v in metadata.items():
        if v is None:
            meta.pop(k, None)
    return BlockQUBO(qubo.H, qubo.g, names=qubo.names, kinds=qubo.kinds, sizes=qubo.sizes, metadata=meta)


def test_a_checkpoint_with_other_shapes_is_ignored(tiny_model, tiny_windows, tmp_path):
    model = tiny_model("llama", n_layers=3)
    windows = tiny_windows(model, n=4, seq_len=10)
    kw = dict(estimator="fisher", loss="kl", batch_size=2, progress=False, checkpoint=tmp_path)
    whole = estimate_hessian(model, None, windows, estimator="fisher", loss="kl", batch_size=2, progress=False)
    with pytest.raises(Interrupt):
        estimate_hessian(model, None, windows, callback=_stop_after(0), **kw)
    (path,) = tmp_path.glob("*.ckpt.npz")
    with np.load(path) as z:
        data = {k: z[k] for k in z.files}
    data = {k: (np.zeros((7, 7)) if k.startswith("state__") and k != "state___work" else v) for k, v in data.items()}
    np.savez(path, **data)
    with pytest.warns(UserWarning, match="does not fit"):
        q = estimate_hessian(model, None, windows, **kw)
    assert q.metadata["resumed_from_batch"] == 0
    np.testing.assert_array_equal(q.H, whole.H)
