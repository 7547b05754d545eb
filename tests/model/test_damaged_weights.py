"""A model folder whose weights file is truncated or missing is a CorruptFileError naming the file, through every
load route (issue 38, cases 4 and 5): cbo.load_pruned, load_model (what `cbo prune` and `cbo eval` use) and
`cbo widths`; load_pruned of something that is not a path says so."""

from __future__ import annotations

import shutil

import pytest
from tiny_models import save_word_model
from typer.testing import CliRunner

from cbo.cli import app, register_commands
from cbo.errors import CorruptFileError, InvalidOptionError
from cbo.model.loading import load_model
from cbo.model.weight_files import check_weight_files
from cbo.surgery.depth import remove_blocks
from cbo.surgery.io import load_pruned, save_pruned


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """(plain model folder, pruned model folder), each whole."""
    root = tmp_path_factory.mktemp("weights")
    model, tok = save_word_model(root / "plain", n_layers=3)
    pruned = save_pruned(remove_blocks(model, [1]), root / "pruned", tok)
    return root / "plain", pruned


def damaged(folder, tmp_path, how):
    copy = tmp_path / f"{folder.name}-{how}"
    shutil.copytree(folder, copy)
    weights = copy / "model.safetensors"
    if how == "truncated":
        data = weights.read_bytes()
        weights.write_bytes(data[: len(data) // 2])
    else:
        weights.unlink()
    return copy


@pytest.mark.parametrize("how", ["truncated", "missing"])
@pytest.mark.parametrize("which", [0, 1], ids=["plain", "pruned"])
def test_a_damaged_weights_file_is_a_corrupt_file_error_naming_it(folders, tmp_path, how, which):
    folder = damaged(folders[which], tmp_path, how)
    named = "truncated or damaged" if how == "truncated" else "holds no weights file"
    for load in (load_model, load_pruned, check_weight_files):
        with pytest.raises(CorruptFileError, match=named) as caught:
            load(folder)
        assert str(folder) in str(caught.value)
    if how == "truncated":
        assert "model.safetensors" in str(caught.value)
    register_commands()
    res = CliRunner().invoke(app, ["widths", str(folder)])
    assert res.exit_code == 2 and named in " ".join(res.output.split()) and res.exception.__class__ is SystemExit


def test_whole_folders_pass_and_a_sharded_folder_names_its_missing_shard(folders, tmp_path):
    for folder in folders:
        check_weight_files(folder)
    model = load_pruned(folders[1])
    sharded = tmp_path / "sharded"
    model.save_pretrained(sharded, max_shard_size="20KB")
    shards = sorted(sharded.glob("model-*.safetensors"))
    assert len(shards) > 1
    check_weight_files(sharded)
    shards[1].unlink()
    with pytest.raises(CorruptFileError, match=shards[1].name):
        check_weight_files(sharded)


def test_load_pruned_of_a_non_path_says_what_it_needs():
    for bad in (123, None, ["a"]):
        with pytest.raises(InvalidOptionError, match="path of a saved model folder"):
            load_pruned(bad)
