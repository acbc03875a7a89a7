"""The project's own error types. Every user-facing failure is one of these with a one-line message
naming the file, line or key and what was expected."""


class FourfoldError(Exception):
    """Base class of every error fourfold raises on purpose."""


class ConfigError(FourfoldError, ValueError):
    """A config key is unknown, has the wrong type, or the combination is impossible."""


class DataError(FourfoldError, ValueError):
    """A data file is malformed: names the file, the line and the problem."""


class ModelLoadError(FourfoldError, ValueError):
    """A model directory or name cannot be loaded as the role asked for."""


class NonFiniteError(FourfoldError, RuntimeError):
    """Training stopped after too many consecutive non-finite updates."""
