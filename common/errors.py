"""The one exception the scripts show to users instead of a traceback."""


class UserError(Exception):
    """A problem the user can fix: its message is one line naming what is missing and how to get it. Several
    problems, UserError(first, second), read as one line, "first; also second", each kept apart in .args."""

    def __str__(self):
        return "; also ".join(map(str, self.args))
