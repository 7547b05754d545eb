"""Model surgery: ``depth`` deletes layers or zeroes sublayers; ``width`` slices heads and neurons; ``io`` saves
and loads pruned models."""

from cbo.surgery.depth import load_pruned_depth, remove_blocks, remove_sublayers, restore_zeroed_sublayers

__all__ = ["load_pruned_depth", "remove_blocks", "remove_sublayers", "restore_zeroed_sublayers"]
