"""Search over removal sets: the refine loop (refit -> propose -> measure, ``refine.py``), its options
(``options.py``), its prior, surrogate and moves."""
