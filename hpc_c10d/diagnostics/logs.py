"""The package's logger: standard ``logging`` under the name ``hpc_c10d``, the rank in every record.

Every record gets a ``rank`` attribute and its message starts with ``[rank N]``. At debug
level INFO (DETAIL: DEBUG) the logger is switched on and, if the program configured no
logging, writes to stderr; at OFF only warnings and errors come out (through logging's
last-resort handler when nothing else is set up).
"""

from __future__ import annotations

import logging

from ..state import _world
from . import debug

__all__ = ["logger", "configure"]

logger = logging.getLogger("hpc_c10d")


class _RankFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "rank"):
            pg = _world.default_pg
            rank = pg._rank if pg is not None else "-"
            record.__dict__["rank"] = rank  # as logging itself adds the fields of ``extra=``
            record.msg = f"[rank {rank}] {record.msg}"
        return True


logger.addFilter(_RankFilter())


def configure() -> None:
    """Match the logger's level to the debug level (called by ``init_process_group``)."""
    level = debug.get_debug_level()
    if level == debug.DebugLevel.OFF:
        return
    logger.setLevel(logging.DEBUG if level == debug.DebugLevel.DETAIL else logging.INFO)
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        logger.addHandler(handler)
