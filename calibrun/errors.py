"""The one exception type calibrun raises for bad input; front ends print it as one line."""


class CalibrunError(Exception):
    """A problem with the user's input (file, value, config) that the user can fix."""
