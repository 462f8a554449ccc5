"""The last line of error translation around the worker's Flight handlers.

Kept apart from the handlers: whatever escapes one leaves as a FlightError with an
``ErrorInfo``, never as pyarrow's status with a Python traceback in it.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import pyarrow.flight as fl

from flight.errors import light_copy
from flight.wire._proto import protocol_pb2
from flight.wire.protocol import status_error

__all__ = ["error_boundary"]

log = logging.getLogger("flight.worker.server")

_Handler = TypeVar("_Handler", bound=Callable[..., Any])


def error_boundary(handler: _Handler) -> _Handler:
    """The last line of error translation: whatever escapes a handler leaves as a FlightError.

    The handlers raise FlightErrors (``status_error``) for everything they expect; anything
    else is a bug here, logged with its traceback, and the client sees only its type — no
    traceback, path or message that might hold file contents. Every call's end, refused or not,
    is told to the server (``call_ended``): a call that never became a task may still have held
    memory (a 64 MiB header decoded and refused), which an idle worker gives back.
    """

    @functools.wraps(handler)
    def wrapped(self: Any, *args: Any) -> Any:
        try:
            return handler(self, *args)
        except fl.FlightError as exc:
            error = light_copy(exc)
        except Exception as exc:
            log.warning("%s failed unexpectedly", handler.__name__, exc_info=True)
            message = f"internal error in {handler.__name__} on {self.url}: {type(exc).__name__} (details in the worker's log)"
            error = status_error(protocol_pb2.ErrorInfo(code=protocol_pb2.ERROR_CODE_EXECUTION, message=message, worker_url=self.url))
        finally:
            self.call_ended()
        # Raised out here, as a copy without traceback or context, and without the call's arguments:
        # pyarrow may keep the exception a handler raises, and with it every frame of the handler (the
        # task, its readers, its buffers) for the process's life (worker/memory.py).
        del args
        raise error

    return wrapped  # type: ignore[return-value]
