"""Errors of the library, raised with its own message."""
from . import _capi


class MoeepError(RuntimeError):
    """A call returned something else than epSuccess.

    code: the epResult_t value; name: its name in the header (epTimeout, ...);
    message: the library's epGetLastError text, which names the argument or the
    rank at fault."""

    def __init__(self, code, message):
        self.code = code
        self.name = _capi.RESULT_NAMES.get(code, "epResult %d" % code)
        self.message = message
        super().__init__("%s: %s" % (self.name, message))


def check(code, comm_ptr=None, what=""):
    """Raises MoeepError for a result other than epSuccess, with the message
    kept for comm_ptr (or for this thread when the call had no communicator)."""
    if code == _capi.SUCCESS:
        return
    lib = _capi.lib()
    text = lib.epGetLastError(comm_ptr)
    message = text.decode("utf-8", "replace") if text else ""
    if not message:
        message = (what + ": " if what else "") + lib.epGetErrorString(code).decode()
    raise MoeepError(code, message)
