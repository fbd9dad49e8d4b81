"""The error hierarchy of torch.distributed, every class a RuntimeError."""

__all__ = [
    "DistError",
    "DistBackendError",
    "DistNetworkError",
    "DistStoreError",
    "QueueEmptyError",
]


class DistError(RuntimeError):
    """Base class of every error raised by the distributed package."""


class DistBackendError(DistError):
    """A transport (MPI, NCCL) failed or timed out."""


class DistNetworkError(DistError):
    """A network-level failure between ranks."""


class DistStoreError(DistError):
    """A store operation failed or timed out."""


class QueueEmptyError(DistStoreError):
    """A non-blocking pop found the store queue empty."""
