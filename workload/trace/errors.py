"""The error a trace raises."""


class TraceError(RuntimeError):
    """A module could not be traced on the meta device; the message names the aten op and a fix."""
