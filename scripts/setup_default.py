"""Install the default model (SmolLM2-135M-Instruct), the default text (six Austen novels) and the local lm-eval
tasks made from the text into CBO_HOME.

Run by `make setup`; the same as `cbo setup`. Idempotent: a second run returns at once.
"""

from __future__ import annotations

import sys


def main() -> int:
    from cbo.data import assets
    from cbo.downstream import local_tasks
    from cbo.errors import CBOError

    try:
        model_dir = assets.ensure_default_model(progress=True)
        text_dir = assets.ensure_default_text(progress=True)
        tasks_dir = local_tasks.ensure_local_tasks(text=text_dir)
    except CBOError as exc:
        print(f"setup failed: {exc}", file=sys.stderr)
        return 1
    from cbo.data.domains import ensure_domain_text

    try:  # the test domain (not Austen) is read by benchmarks only: the setup goes on without it
        print(f"test domain:   {ensure_domain_text('pydocs', progress=True)}")
    except CBOError as exc:
        print(f"test domain pydocs not installed: {exc}", file=sys.stderr)
    print(f"default model: {model_dir}")
    print(f"default text:  {text_dir}")
    print(f"local tasks:   {tasks_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
