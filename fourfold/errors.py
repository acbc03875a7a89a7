"""The project's own error types. Every user-facing failure is one of these with a one-line message
naming the file, line or key and what was expected."""

import traceback


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
    """The user's own code (a ``model.reward_fn``, an ``env.factory``) raised: the message says whose
    code it was; the original exception is the ``__cause__``, and the CLI prints its traceback under
    the message (:func:`user_traceback`). The copy another rank of a torchrun job raises
    (:func:`fourfold.dist.raise_first_error`) has no cause: it carries that traceback as text."""

    traceback_text: str = ""
    """The user's traceback as the failing rank formatted it (on a copy from another rank; else '')."""


class RewardServerError(FourfoldError, ConnectionError):
    """A reward server (``model.reward_url``) did not answer, or answered with an error, after
    every retry: the message names the URL and what happened last."""


def user_traceback(error: BaseException) -> str:
    """The traceback of the user's code under a :class:`UserCodeError`: its cause's, from the user's
    frame on (the first frame, fourfold's call into the user's function, is left out), or the text a
    copy from another rank carries; '' for any other error."""
    if not isinstance(error, UserCodeError):
        return ""
    cause = error.__cause__
    if cause is None:
        return error.traceback_text
    tb = cause.__traceback__.tb_next if cause.__traceback__ is not None else None
    return "".join(traceback.format_exception(type(cause), cause, tb or cause.__traceback__))
