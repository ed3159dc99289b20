"""What each weight sync on this rank cost, kept for the progress line (rlhf_cli/rank/progress.py) and the rank's
record (rlhf_cli/rank/record.py). A leaf: imported by every run, with or without a generation engine, so that
nobody has to look for it."""

from __future__ import annotations

from typing import Any


class SyncLog:
    """Each sync's record (seconds, bytes sent, changed share, dense or sparse, peak memory, ...) in order."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self._unread = 0  # calls the progress line has not shown yet

    def add(self, record: dict[str, Any]) -> None:
        self.calls.append(record)

    def take(self) -> list[dict[str, Any]]:
        """The syncs since the last call."""
        new, self._unread = self.calls[self._unread:], len(self.calls)
        return new

    def records(self) -> list[dict[str, Any]] | None:
        """Every sync so far; None when this rank never synced a generator."""
        return list(self.calls) if self.calls else None


SYNC_LOG = SyncLog()  # this rank's
