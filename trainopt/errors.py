"""The one base class for problems a user can fix (bad spec, bad file, busy folder).

The CLI answers any ``UserError`` with its message and exit code 2, never a traceback;
anything else is a bug in trainopt and keeps its traceback.
"""

__all__ = ["UserError"]


class UserError(Exception):
    """A problem the user can fix; its message names what is wrong and how to fix it."""
