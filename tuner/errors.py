"""The one exception type the command line turns into a single clear line."""


class TunerError(Exception):
    """A problem with the user's input or environment; printed as one line, exit 2."""

    exit_code = 2
