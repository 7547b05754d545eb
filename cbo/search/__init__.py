"""Search over removal sets: the refine loop (measure -> refit -> solve), its surrogate and moves."""
