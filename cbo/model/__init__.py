"""The model side: loading, where the removable blocks are, which weights form a structure, forward helpers."""
