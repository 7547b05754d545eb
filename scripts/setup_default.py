"""Install the default model (SmolLM2-135M-Instruct) and text (six Austen novels) into CBO_HOME.

Run by `make setup`; the same as `cbo setup`. Idempotent: a second run returns at once.
"""

from __future__ import annotations

import sys


def main() -> int:
    from cbo.assets import ensure_default_model, ensure_default_text
    from cbo.errors import CBOError

    try:
        model_dir = ensure_default_model(progress=True)
        text_dir = ensure_default_text(progress=True)
    except CBOError as exc:
        print(f"setup failed: {exc}", file=sys.stderr)
        return 1
    print(f"default model: {model_dir}")
    print(f"default text:  {text_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
