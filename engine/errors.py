"""Typed exceptions the engine raises to Python callers; the CLI and HTTP seat turn them into one line / JSON."""

from __future__ import annotations


class NxError(Exception):
    """Base class of every error nxctl reports to a user as a clear message."""


class UnknownModelError(NxError, LookupError):
    """A model name that is neither a named model, a model folder nor a .gguf file."""


class UnsafeModelNameError(UnknownModelError):
    """A model name that would reach outside the store it names (``../``, an absolute path, ``%2e%2e``)."""


class ModelFileError(NxError):
    """A model file or folder that is missing, unreadable or corrupt."""


class UnsupportedModelError(NxError):
    """A model whose architecture or tensor type the engine does not support."""


class KernelBackendError(NxError, ValueError):
    """An NXCTL_KERNELS value that names no kernel backend, or one whose instructions this CPU lacks."""


class InvalidRequestError(NxError, ValueError):
    """Bad request parameters: prompt longer than the context, max_tokens < 1, temperature < 0, ..."""


class CapacityError(NxError):
    """A request that could never fit the KV pool, or a model that could never fit the memory budget."""


class WaitTimeoutError(CapacityError):
    """Gave up waiting for memory or a seat before a deadline."""


class ShuttingDownError(NxError):
    """The seat or engine loop is stopping and takes no new work."""
