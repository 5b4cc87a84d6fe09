"""Errors the command-line tools turn into clear messages."""


class ConfigError(ValueError):
    """A bad command-line value or combination; the message names the flag and the value."""
