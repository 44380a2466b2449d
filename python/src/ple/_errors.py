"""libple's status codes (`Status`) and the exception raised for each (`PleError` and one subclass
per status, each also deriving from the builtin a Python caller catches for that kind of failure).

`Status` restates `enum ple_status_code` of ``ple.h``; ``tests/test_ple.py`` checks every member
against the loaded library's `ple_status_name`, and that the library names no code `Status` lacks.
"""

from __future__ import annotations

import errno as _errno
import os
import re
from enum import IntEnum
from typing import Dict, Optional, Tuple, Type


class Status(IntEnum):
    """A ``ple_status`` value (``PLE_OK`` or a ``PLE_E_*`` code); compares equal to the int."""

    OK = 0
    INVALID_ARGUMENT = -1
    IO = -2
    FORMAT = -3
    TIMEOUT = -4
    STATE = -5
    CUDA_UNAVAILABLE = -6
    CUDA = -7
    UNSUPPORTED = -8
    PANIC = -9
    OUT_OF_MEMORY = -10

    @property
    def c_name(self) -> str:
        """The C name (``"PLE_OK"``, ``"PLE_E_TIMEOUT"``, ...), as `ple_status_name` spells it."""
        return "PLE_OK" if self is Status.OK else f"PLE_E_{self.name}"


class PleError(RuntimeError):
    """A libple call failed. Every libple exception derives from it.

    Attributes
    ----------
    status : int
        The ``PLE_E_*`` code (a `Status` for every code this package knows).
    name : str
        Its C name, e.g. ``"PLE_E_INVALID_ARGUMENT"``.
    message : str
        The cause in words (``ple_last_error_message()``).
    """

    def __init__(self, status: int, name: str, message: str):
        super().__init__(f"{name}: {message}")
        self.status = status
        self.name = name
        self.message = message

    def __reduce__(self) -> Tuple[Type["PleError"], Tuple[int, str, str]]:
        # pickled by its three fields (multiprocessing, torch.distributed), not by `args`
        return (type(self), (self.status, self.name, self.message))


class PleInvalidArgumentError(PleError, ValueError):
    """``PLE_E_INVALID_ARGUMENT``: a bad argument (out-of-range value, malformed batch)."""


class PleIOError(PleError, OSError):
    """``PLE_E_IO``: an I/O call failed. `errno` is the OS error code when libple reported one."""


class PleNotFoundError(PleIOError, FileNotFoundError):
    """``PLE_E_IO`` for a path that does not exist (a missing table or checkpoint directory)."""


class PleFormatError(PleError):
    """``PLE_E_FORMAT``: a file is malformed or does not match its metadata or checkpoint."""


class PleTimeoutError(PleError, TimeoutError):
    """``PLE_E_TIMEOUT``: a wait ran past its timeout."""


class PleStateError(PleError, ValueError):
    """``PLE_E_STATE``: the call does not fit the handle's state (a closed table, a step never
    submitted or already consumed); a `ValueError`, as Python's io raises for a closed file."""


class PleCudaUnavailableError(PleError):
    """``PLE_E_CUDA_UNAVAILABLE``: CUDA was needed (a handle opened without ``cuda_device``, or no
    CUDA driver)."""


class PleCudaError(PleError):
    """``PLE_E_CUDA``: a CUDA driver call failed."""


class PleUnsupportedError(PleError):
    """``PLE_E_UNSUPPORTED``: a valid request this build, table or device does not support."""


class PlePanicError(PleError):
    """``PLE_E_PANIC``: a bug in libple, caught at its boundary (please report it)."""


class PleOutOfMemoryError(PleError, MemoryError):
    """``PLE_E_OUT_OF_MEMORY``: an allocation failed."""


ERROR_CLASSES: Dict[Status, Type[PleError]] = {
    Status.INVALID_ARGUMENT: PleInvalidArgumentError,
    Status.IO: PleIOError,
    Status.FORMAT: PleFormatError,
    Status.TIMEOUT: PleTimeoutError,
    Status.STATE: PleStateError,
    Status.CUDA_UNAVAILABLE: PleCudaUnavailableError,
    Status.CUDA: PleCudaError,
    Status.UNSUPPORTED: PleUnsupportedError,
    Status.PANIC: PlePanicError,
    Status.OUT_OF_MEMORY: PleOutOfMemoryError,
}

def invalid_argument(message: str) -> PleInvalidArgumentError:
    """A `PleInvalidArgumentError` raised by the bindings themselves, before any libple call (an
    input the C types cannot hold as given)."""
    return PleInvalidArgumentError(Status.INVALID_ARGUMENT, Status.INVALID_ARGUMENT.c_name, message)


# Rust's `io::Error` display of an OS error ends "(os error N)"
_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def error_for(status: int, name: str, message: str, path: Optional[str] = None) -> PleError:
    """The exception for a failed call's `status`.

    Parameters
    ----------
    status : int
        The ``PLE_E_*`` code the call returned (not ``PLE_OK``).
    name : str
        Its C name (``ple_status_name``).
    message : str
        The cause in words.
    path : str, optional
        The path the call opened: a ``PLE_E_IO`` failure while it does not exist is a
        `PleNotFoundError` (``errno`` ``ENOENT``), as is one whose OS error is ``ENOENT``.

    Returns
    -------
    PleError
        An instance of the status's subclass (plain `PleError` for a code this package does not
        know).
    """
    try:
        cls: Type[PleError] = ERROR_CLASSES[Status(status)]
    except ValueError:  # a code newer than this package
        cls = PleError
    code: Optional[int] = None
    if cls is PleIOError:
        m = _OS_ERROR.search(message)
        code = int(m.group(1)) if m else None
        if code == _errno.ENOENT or (path is not None and not os.path.lexists(path)):
            cls, code = PleNotFoundError, _errno.ENOENT
    e = cls(status, name, message)
    if code is not None:
        assert isinstance(e, OSError)
        e.errno = code
    return e
