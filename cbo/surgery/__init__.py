"""Model surgery: ``depth`` deletes layers or zeroes sublayers; ``width`` slices heads and neurons; ``io`` is the one
save and load route of every pruned model."""

from cbo.surgery.depth import remove_blocks, remove_sublayers, restore_zeroed_sublayers

__all__ = ["remove_blocks", "remove_sublayers", "restore_zeroed_sublayers"]
