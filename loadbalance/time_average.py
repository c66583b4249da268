"""Time averages: Pulsar's ``TimeAverageMessageData``, ``BundleData``,
``TimeAverageBrokerData`` and the broker's history-weighted usage.

* ``TimeAverageMessageData.update``: ``n = min(n + 1, max_samples)``;
  ``avg = ((n - 1) * avg + sample) / n`` - a cumulative mean until ``max_samples`` samples, then
  an exponential average with weight ``1 / max_samples``.
* ``BundleData``: 10 short-term and 1000 long-term samples (``NUM_SHORT_SAMPLES``,
  ``NUM_LONG_SAMPLES`` in ``ModularLoadManagerImpl``); an unseen bundle starts from
  ``DEFAULT_MESSAGE_RATE = 50`` msg/s and ``DEFAULT_MESSAGE_THROUGHPUT = 50000`` B/s in and out,
  overwritten by its first real sample.
* ``history_usage``: ``usage = h * prev + (1 - h) * current`` (ThresholdShedder /
  ``BrokerLoadData.weightedMaxEMA``), seeded with the first reading (the fix of Pulsar #13119).
* ``TimeAverageBrokerData``: sums of the broker's bundles' short and long term data.

A sample is taken each time a report carrying the bundle arrives, so the windows are counted in
reports, not seconds, exactly as in Pulsar.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from loadbalance.model import NamespaceBundleStats

NUM_SHORT_SAMPLES = 10
NUM_LONG_SAMPLES = 1000
DEFAULT_MESSAGE_RATE = 50.0
DEFAULT_MESSAGE_THROUGHPUT = 50000.0


def fold_mean(old: Any, sample: Any, n: Any) -> Any:
    """The one averaging fold: ``((n - 1) * old + sample) / n``, with ``n = min(samples so far +
    1, max_samples)`` (``TimeAverageMessageData.update``).

    Written with arithmetic operators only, so the core's per-bundle view folds a float with it
    and the streaming job's shard state folds NumPy columns with it: the same IEEE operations in
    the same order, hence the same bits, from one definition.
    """
    return ((n - 1) * old + sample) / n


@dataclass(frozen=True, slots=True)
class TimeAverageMessageData:
    """Averaged message rates and throughputs over a bounded number of samples."""

    max_samples: int
    num_samples: int = 0
    msg_throughput_in: float = DEFAULT_MESSAGE_THROUGHPUT
    msg_throughput_out: float = DEFAULT_MESSAGE_THROUGHPUT
    msg_rate_in: float = DEFAULT_MESSAGE_RATE
    msg_rate_out: float = DEFAULT_MESSAGE_RATE

    def update(self, stats: NamespaceBundleStats) -> TimeAverageMessageData:
        return self.update_values(
            stats.msg_throughput_in,
            stats.msg_throughput_out,
            stats.msg_rate_in,
            stats.msg_rate_out,
        )

    def update_values(
        self, thr_in: float, thr_out: float, rate_in: float, rate_out: float
    ) -> TimeAverageMessageData:
        n = min(self.num_samples + 1, self.max_samples)
        return TimeAverageMessageData(
            self.max_samples,
            n,
            fold_mean(self.msg_throughput_in, thr_in, n),
            fold_mean(self.msg_throughput_out, thr_out, n),
            fold_mean(self.msg_rate_in, rate_in, n),
            fold_mean(self.msg_rate_out, rate_out, n),
        )

    @property
    def msg_rate(self) -> float:
        return self.msg_rate_in + self.msg_rate_out

    @property
    def msg_throughput(self) -> float:
        return self.msg_throughput_in + self.msg_throughput_out


@dataclass(frozen=True, slots=True)
class BundleData:
    """Short- and long-term averages of one bundle, plus its last topic count."""

    short_term: TimeAverageMessageData = TimeAverageMessageData(NUM_SHORT_SAMPLES)
    long_term: TimeAverageMessageData = TimeAverageMessageData(NUM_LONG_SAMPLES)
    topics: int = 0

    @classmethod
    def new(cls) -> BundleData:
        """Default data for a bundle never seen before (Pulsar's defaults)."""
        return cls()

    def update(self, stats: NamespaceBundleStats) -> BundleData:
        return BundleData(self.short_term.update(stats), self.long_term.update(stats), stats.topics)


def update_bundle_data(
    data: BundleData | None, samples: Iterable[NamespaceBundleStats]
) -> BundleData:
    """Fold a sequence of samples into a bundle's data (``None`` = never seen)."""
    out = data if data is not None else BundleData.new()
    for s in samples:
        out = out.update(s)
    return out


def history_usage(previous: float | None, current: float, history_percentage: float) -> float:
    """History-weighted usage: the first reading as it is, then an EMA with weight ``h``."""
    if previous is None:
        return current
    return previous * history_percentage + (1.0 - history_percentage) * current


@dataclass(frozen=True, slots=True)
class TimeAverageBrokerData:
    """Sums of a broker's bundles' averages (Pulsar's ``TimeAverageBrokerData``)."""

    short_term_msg_throughput_in: float = 0.0
    short_term_msg_throughput_out: float = 0.0
    short_term_msg_rate_in: float = 0.0
    short_term_msg_rate_out: float = 0.0
    long_term_msg_throughput_in: float = 0.0
    long_term_msg_throughput_out: float = 0.0
    long_term_msg_rate_in: float = 0.0
    long_term_msg_rate_out: float = 0.0

    @classmethod
    def of(cls, bundles: Iterable[BundleData]) -> TimeAverageBrokerData:
        """The sums, each correctly rounded (``math.fsum``), so independent of the order.

        Deviation from Pulsar, which adds doubles in its map's order: a broker's bundles are a
        ``frozenset`` whose order follows Python's per-process string hash, so plain ``+=``
        gave sums that differed in the last bits between two processes (a replayed cycle after
        a restart could then break a near-tie the other way). Exact sums are the same bits in
        every process and in whatever order a caller holds the bundles (the streaming job sums
        its NumPy columns the same way)."""
        columns: list[list[float]] = [[], [], [], [], [], [], [], []]
        for b in bundles:
            st, lt = b.short_term, b.long_term
            columns[0].append(st.msg_throughput_in)
            columns[1].append(st.msg_throughput_out)
            columns[2].append(st.msg_rate_in)
            columns[3].append(st.msg_rate_out)
            columns[4].append(lt.msg_throughput_in)
            columns[5].append(lt.msg_throughput_out)
            columns[6].append(lt.msg_rate_in)
            columns[7].append(lt.msg_rate_out)
        return cls(*(math.fsum(c) for c in columns))

    @property
    def long_term_msg_rate(self) -> float:
        return self.long_term_msg_rate_in + self.long_term_msg_rate_out

    @property
    def short_term_msg_throughput(self) -> float:
        return self.short_term_msg_throughput_in + self.short_term_msg_throughput_out

    @property
    def long_term_msg_throughput(self) -> float:
        return self.long_term_msg_throughput_in + self.long_term_msg_throughput_out
