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

    def progress_text(self) -> str:
        """`  sync 0.21 s 4.2 MiB sparse 0.8% 96 KiB check 3e-07`: the syncs since the last call (`take`): seconds in
        all, their largest gathered bytes, the last one's kind (dense, sparse with the share of elements that
        changed, or adapter: LoRA's matrices alone) and bytes sent, and the largest difference the self-check measured
        (rlhf_cli/rank/engines/vllm/self_check.py) between the engine's logprobs and the policy's, when it ran;
        empty without syncs."""
        from rlhf_cli.sizes import readable

        calls = self.take()
        if not calls:
            return ""
        checked = [c["check_logp_difference"] for c in calls if "check_logp_difference" in c]
        check = f" check {max(checked):.2g}" if checked else ""
        last = calls[-1]
        kind = {"sparse": f" sparse {last.get('changed_share') or 0:.2%}", "adapter": " adapter"}.get(last.get("mode"),
                                                                                                    " dense")
        return (f"  sync {sum(c['seconds'] for c in calls):.3g} s {readable(max(c['peak_bytes'] for c in calls))}"
                f"{kind} {readable(last['bytes_sent'])}{check}")

    def records(self) -> list[dict[str, Any]] | None:
        """Every sync so far; None when this rank never synced a generator."""
        return list(self.calls) if self.calls else None


SYNC_LOG = SyncLog()  # this rank's
