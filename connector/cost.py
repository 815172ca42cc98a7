"""When does loading from the pool beat recomputing? A running estimate of both sides.

    load_time(tokens)      = lookup_latency + tokens * bytes_per_token / load_bandwidth
    recompute_time(tokens) = tokens / prefill_rate

Both rates are exponentially weighted averages of what this connector measured (a load's bytes and seconds; a
prefill's tokens and seconds), started from priors that favour loading: a pool that has never been measured is
tried, and the first load measures it. A slow pool (remote, congested, SSD-bound) then stops being used for hits it
would make slower, and starts again if prefill turns out slower than thought. Skipped loads measure nothing, so one
slow first load (a cold page cache, a busy moment) would switch loading off for good: every `probe_every`-th hit
that the estimate would skip is loaded anyway, to measure the pool again.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvpool.pool import MAX_S_PER_TOKEN


@dataclass(slots=True)
class LoadCostModel:
    bytes_per_token: int
    load_bandwidth: float = 2e9          # bytes/s prior: a same-host memcpy-class path
    prefill_rate: float = 2e3            # tokens/s prior: CPU-class prefill of a small model
    lookup_latency: float = 1e-3         # seconds per lookup + get round trip
    alpha: float = 0.3                   # weight of the newest measurement
    probe_every: int = 32                # load one in this many hits the estimate skips, to re-measure
    loads_measured: int = 0
    prefills_measured: int = 0
    skipped: int = 0                     # hits skipped as slower since the last load

    def observe_load(self, nbytes: int, seconds: float) -> None:
        if nbytes <= 0 or seconds <= 0:
            return
        self.load_bandwidth = self._mix(self.load_bandwidth, nbytes / seconds, self.loads_measured)
        self.loads_measured += 1

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        if tokens <= 0 or seconds <= 0:
            return
        self.prefill_rate = self._mix(self.prefill_rate, tokens / seconds, self.prefills_measured)
        self.prefills_measured += 1

    def load_seconds(self, tokens: int) -> float:
        return self.lookup_latency + tokens * self.bytes_per_token / self.load_bandwidth

    def recompute_seconds(self, tokens: int) -> float:
        return tokens / self.prefill_rate

    def should_load(self, tokens: int) -> bool:
        if tokens <= 0:
            return False
        if self.load_seconds(tokens) < self.recompute_seconds(tokens) or self.skipped + 1 >= self.probe_every:
            self.skipped = 0
            return True
        self.skipped += 1
        return False

    def _mix(self, old: float, new: float, count: int) -> float:
        # The first measurement replaces the prior outright: priors are guesses, measurements are not.
        return new if count == 0 else (1 - self.alpha) * old + self.alpha * new


def prefill_s_per_token(cost: LoadCostModel | None) -> float:
    """What a lookup reports to the pool as this engine's prefill seconds per token (the pool counts hit tokens x
    it as prefill seconds saved): the measured rate, or 0 before any prefill was timed (the prior is a guess)."""
    if cost is None or not cost.prefills_measured or cost.prefill_rate <= 0:
        return 0.0
    return min(1.0 / cost.prefill_rate, MAX_S_PER_TOKEN)

