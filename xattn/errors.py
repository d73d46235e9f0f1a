"""User-facing errors: the CLI prints their message as one line and exits non-zero."""


class XattnError(Exception):
    """A mistake in user input (file, config key, flag); its message names the culprit."""
