"""Ctrl-C during a solve: the first one asks the solver to stop and return its best states so far.

A solver deep in a numba kernel, a C++ sampler or an optimizer callback cannot be stopped cleanly by a
``KeyboardInterrupt`` raised wherever Python happens to be (D-Wave's annealer prints "Exception ignored in
interrupt_callback" and runs on; others lose everything found). So while ``solve()`` runs a solver in the main
thread, SIGINT only sets the problem's stop event; every solver polls it (``Problem.interrupted``, and
``Problem.time_left()`` drops to 0) at its natural checkpoints and returns what it has, marked interrupted. A
second Ctrl-C raises ``KeyboardInterrupt`` at once, as usual.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Any, Iterator


@contextmanager
def stop_on_interrupt(event: threading.Event) -> Iterator[bool]:
    """While the block runs, the first SIGINT sets ``event``; a second raises ``KeyboardInterrupt``.

    Only in the main thread and only over Python's default SIGINT handler (a handler someone else
    installed, or an ignored SIGINT, is left alone); yields whether the handler was installed.
    """
    if threading.current_thread() is not threading.main_thread():
        yield False
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is not signal.default_int_handler:
        yield False
        return

    def handler(signum: int, frame: Any) -> None:
        if event.is_set():
            raise KeyboardInterrupt
        event.set()

    signal.signal(signal.SIGINT, handler)
    try:
        yield True
    finally:
        signal.signal(signal.SIGINT, previous)
