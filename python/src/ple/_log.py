"""libple's log messages in Python (``ple_set_log_callback``): `set_log_callback` for any
function, `log_to_python` for the ``logging`` logger ``"ple"``.

libple calls the callback on its own ``ple-log`` thread, never inside another libple call; ctypes
takes the GIL for it. Every ctypes function object handed to libple is kept for the life of the
process (one per call: no lock is needed, which a callback that re-registers from libple's thread
would deadlock on), and an ``atexit`` hook removes the callback before the interpreter shuts
down."""

from __future__ import annotations

import atexit
import logging
from typing import Callable, List, Optional

from ._lib import LOG_FN, LOG_LEVELS, check, lib
from ._types import LogLevel

LOGGER_NAME = "ple"
#: ``logging`` level of each ``PLE_LOG_*`` value (trace has no ``logging`` name: 5, below DEBUG)
LOGGING_LEVELS = {1: logging.ERROR, 2: logging.WARNING, 3: logging.INFO, 4: logging.DEBUG, 5: 5}

_kept: List[object] = []  # every LOG_FN handed to libple: it may still be running one
_installed = False


def set_log_callback(callback: Optional[Callable[[int, str], object]], max_level: LogLevel = "warn") -> None:
    """Routes libple's log messages to `callback` (``ple_set_log_callback``), replacing any
    callback set before; None removes it (messages then go to stderr at ``PLE_LOG``'s level).

    Parameters
    ----------
    callback : callable or None
        ``callback(level, message)``: `level` a ``PLE_LOG_*`` value (1 = error ... 5 = trace).
        It runs on libple's log thread; an exception it raises is logged to the ``"ple"`` logger
        and otherwise ignored.
    max_level : {"error", "warn", "info", "debug", "trace"}, default "warn"
        The most verbose level delivered.

    Raises
    ------
    ValueError
        `max_level` is none of the names.
    """
    global _installed
    try:
        level = LOG_LEVELS[max_level]
    except KeyError:
        raise ValueError(f"max_level must be one of {list(LOG_LEVELS)}, got {max_level!r}") from None

    def deliver(lvl: int, msg: Optional[bytes], _user: Optional[int]) -> None:
        if lvl > level:  # libple only ever raises its level filter: a lower max_level is kept here
            return
        text = (msg or b"").decode("utf-8", "replace")
        try:
            assert callback is not None  # installed only with a callback
            callback(lvl, text)
        except Exception:  # noqa: BLE001 - nothing may propagate into libple's thread
            logging.getLogger(LOGGER_NAME).exception("ple log callback failed on %r", text)

    fn = LOG_FN(deliver) if callback is not None else LOG_FN()
    _kept.append(fn)
    check(lib.ple_set_log_callback(fn, level, None))
    _installed = callback is not None


def log_to_python(max_level: Optional[LogLevel] = "warn") -> None:
    """Sends libple's log messages to the ``logging`` logger ``"ple"`` (errors as
    ``logging.ERROR``, warnings as ``WARNING``, ..., trace as level 5), so the application's
    handlers and levels apply.

    Parameters
    ----------
    max_level : {"error", "warn", "info", "debug", "trace"} or None, default "warn"
        The most verbose level libple delivers; None stops the routing.

    Raises
    ------
    ValueError
        `max_level` is none of the names.
    """
    if max_level is None:
        set_log_callback(None)
        return
    logger = logging.getLogger(LOGGER_NAME)

    def emit(level: int, message: str) -> None:
        logger.log(LOGGING_LEVELS.get(level, logging.WARNING), "%s", message)

    set_log_callback(emit, max_level)


def _remove_at_exit() -> None:
    if _installed:
        try:
            set_log_callback(None)
        except Exception:  # noqa: BLE001 - shutting down: nothing left to report to
            pass


atexit.register(_remove_at_exit)
