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


class OutputError(FourfoldError, OSError):
    """A run's output cannot be written: the output directory is a file, read-only or not creatable,
    or the disk (or the file-size limit) is full while saving. Names the path."""


class UserCodeError(FourfoldError, RuntimeError):
    """The user's own code (a ``model.reward_fn``) raised: the message says whose code it was; the
    original exception is the ``__cause__``, and the CLI prints its traceback under the message."""


class RewardServerError(FourfoldError, ConnectionError):
    """A reward server (``model.reward_url``) did not answer, or answered with an error, after
    every retry: the message names the URL and what happened last."""
