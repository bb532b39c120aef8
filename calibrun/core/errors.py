"""The one exception type calibrun raises for bad input, and how any error becomes one line."""


class CalibrunError(Exception):
    """A problem with the user's input (file, value, config) that the user can fix."""


def one_line(exc: BaseException) -> str:
    """The error's message on one line (library messages often continue on the next lines)."""
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def need(ok: bool, key: str, rule: str, value) -> None:
    """A config value check: CalibrunError `config <key>: <rule>, got <value>` unless `ok`."""
    if not ok:
        raise CalibrunError(f"config {key}: {rule}, got {value!r}")


def first_few(names, shown: int = 3) -> str:
    """Names for a message: the first `shown`, then how many more (`a, b, c and 4 more`)."""
    names = list(names)
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")
