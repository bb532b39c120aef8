"""SIGINT and SIGTERM as an exception, and never lost.

calibrun.sweep's handler raises `Interrupted` where the process is, so that the job and the sweep unwind and close
their MLflow runs; it ignores further signals while they close. Raised inside a finaliser (a `__del__`, a weakref
or gc callback), an exception is printed as "Exception ignored in ..." and dropped by Python: the sweep would then
run on to its end with Ctrl-C ignored. So the handler also records the signal here, the points where work goes on
(every atomic write, every job's start) raise it again (`check`), and the places that handle the interrupt clear it
(`acknowledge`).
"""

from __future__ import annotations

import signal

_pending: int | None = None


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM, raised where the process is, so that the job and the sweep unwind and close their runs."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def record(signum: int) -> None:
    global _pending
    _pending = signum


def acknowledge() -> None:
    """The interrupt reached a handler: it need not be raised again."""
    global _pending
    _pending = None


def check() -> None:
    """Raise a recorded interrupt that no handler has seen (it was dropped on the way)."""
    if _pending is not None:
        signum = _pending
        acknowledge()
        raise Interrupted(signum)
