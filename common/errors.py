"""The one exception the scripts show to users instead of a traceback."""


class UserError(Exception):
    """A problem the user can fix (missing weights, data or device).

    Its message is one line that names what is missing and how to get it.
    """
