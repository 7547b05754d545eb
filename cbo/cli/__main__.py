"""``python -m cbo.cli``: the ``cbo`` command."""

from cbo.cli import main

main()
