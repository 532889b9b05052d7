"""The one exception type the local-server manager raises."""


class LocalDBError(RuntimeError):
    """A failure that the CLI reports as one line: what failed and what to do next."""
