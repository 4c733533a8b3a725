"""The one base class for problems a user can fix (bad spec, bad file, busy folder).

The CLI answers any ``UserError`` with ``render()`` and exit code 2, never a traceback;
anything else is a bug in trainopt and keeps its traceback. Every module's own user
error subclasses it: ``SpecError`` (contract/spec.py), ``WorkloadError`` (contract/reference.py),
``ResultsError`` (outputs/results.py), ``SpecChangedError`` and ``StorageError`` (search/store.py),
``OutputFolderError`` (outputs/workspace.py), ``SchemaVersionError`` (contract/protocol.py),
``SettingsError`` (settings/record.py), ``ExportError`` (settings/export/).
"""

__all__ = ["UserError"]


class UserError(Exception):
    """A problem the user can fix; its message names what is wrong and how to fix it."""

    def render(self) -> str:
        """The text shown to the user (one line, or one line per problem)."""
        return str(self)
