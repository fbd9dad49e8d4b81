"""The error hierarchy of torch.distributed, every class a RuntimeError."""

__all__ = [
    "DistError",
    "DistBackendError",
    "ProcessFailedError",
    "DistNetworkError",
    "DistStoreError",
    "QueueEmptyError",
]


class DistError(RuntimeError):
    """Base class of every error raised by the distributed package."""


class DistBackendError(DistError):
    """A transport (MPI, NCCL) failed or timed out."""


class ProcessFailedError(DistBackendError):
    """Ranks of a group died (under ULFM, which lets the survivors go on): ``failed_ranks`` are
    their ranks in ``group_name``'s group, agreed on by every survivor, ready for ``shrink_group``;
    ``failed_hosts`` their hosts, where known."""

    def __init__(self, message: str, failed_ranks: list[int], failed_hosts: list[str | None],
                 group_name: str) -> None:
        super().__init__(message)
        self.failed_ranks = failed_ranks
        self.failed_hosts = failed_hosts
        self.group_name = group_name


class DistNetworkError(DistError):
    """A network-level failure between ranks."""


class DistStoreError(DistError):
    """A store operation failed or timed out."""


class QueueEmptyError(DistStoreError):
    """A non-blocking pop found the store queue empty."""
