"""What transformers and other libraries print while models load and save: :func:`quiet_loading` turns off their
progress bars, messages and Python warnings (what the CLI's ``-q`` asks for); :func:`silenced` also holds back
whatever they print directly."""

from __future__ import annotations

import contextlib
import io
import os
import warnings
from collections.abc import Iterator


@contextlib.contextmanager
def quiet_loading(quiet: bool = True) -> Iterator[None]:
    """While active (when ``quiet``), transformers prints no progress bars ("Loading weights"), no info or
    warning messages, and Python warnings are not shown; the previous settings are restored afterwards."""
    if not quiet:
        yield
        return
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


@contextlib.contextmanager
def silenced(quiet: bool = True) -> Iterator[None]:
    """:func:`quiet_loading`, and whatever libraries print held back while active: Python's stdout and stderr
    (progress bars no setting turns off, such as those of transformers' GGUF reader or lm-eval's request loops)
    and the stderr of the subprocesses they start. Errors still raise."""
    if not quiet:
        yield
        return
    saved_fd = None
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            saved_fd = os.dup(2)
            os.dup2(devnull, 2)
        finally:
            os.close(devnull)
    except OSError:  # no file descriptor 2 to redirect: Python-level redirection only
        saved_fd = None
    try:
        with quiet_loading(True), contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        if saved_fd is not None:
            os.dup2(saved_fd, 2)
            os.close(saved_fd)
