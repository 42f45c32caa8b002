"""Several data sources in one stream of prompts, in the proportions of their weights.

``WeightedInterleave`` decides which source serves the next prompt. With shares p_i = w_i / sum(w)
and c_i(n) the prompts source i served among the first n, it serves next the source that is most
behind its share, the largest (n + 1) p_i - c_i (ties: the first source in the list). With integer
weights the mix is exact over every window of sum(w) prompts and never more than one prompt off its
share in between: weights 3 and 1 serve A A B A | A A B A | ... (the tests check this on random
integer weights; give weights as integers, or ratios of small integers, to have it). Real weights
stay within about one prompt of their share (at most 1.1 in the tests' random weights). There is no
randomness: the same weights give the same order on every run (the seed does not enter), and the
order continues where it stopped from the saved counts (``MixState``).

``MixedStream`` puts the interleave in front of one ``PromptStream`` per source (each sharded over
the generators as a single source is) and stamps every prompt with its source's name and response
budget. Its ``state`` (the counts and every source's ``StreamState``) is what the generator's prompt
position file keeps, so a restarted generator continues the mix and every source where they were.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from stream_dapo.data.dataset import PromptItem, PromptStream, StreamState

__all__ = ["MixState", "MixedStream", "WeightedInterleave"]


class WeightedInterleave:
    """Which source comes next, by the largest deficit against its share (see the module docstring)."""

    def __init__(self, weights: Sequence[float], counts: Sequence[int] | None = None) -> None:
        if not weights:
            raise ValueError("a mix needs at least one source")
        if not all(isinstance(w, (int, float)) and math.isfinite(w) and w > 0 for w in weights):
            raise ValueError(f"source weights must be finite numbers > 0, got {list(weights)}")
        total = float(sum(weights))
        self.shares = [float(w) / total for w in weights]
        self.counts = [0] * len(weights) if counts is None else [int(c) for c in counts]
        if len(self.counts) != len(weights) or any(c < 0 for c in self.counts):
            raise ValueError(f"counts {list(self.counts)} do not fit {len(weights)} sources")

    @property
    def served(self) -> int:
        return sum(self.counts)

    def next(self) -> int:
        """The index of the source that serves the next prompt (and count it)."""
        n1 = self.served + 1
        best = max(range(len(self.shares)), key=lambda i: (n1 * self.shares[i] - self.counts[i], -i))
        self.counts[best] += 1
        return best


@dataclass(frozen=True)
class MixState:
    """Where a ``MixedStream`` resumes: prompts served per source, and each source's stream position."""

    counts: dict[str, int] = field(default_factory=dict)
    streams: dict[str, StreamState] = field(default_factory=dict)


class MixedStream(Iterator[PromptItem]):
    """An endless stream over several sources' ``PromptStream``s, mixed by weight.

    Example: sources "words" (weight 3) and "format" (weight 1) serve words, words, format, words,
    then the same again; each prompt's ``source`` says which, and ``max_response_len`` is its
    source's budget (None: the run's).
    """

    def __init__(
        self,
        streams: Mapping[str, PromptStream],
        weights: Mapping[str, float],
        *,
        budgets: Mapping[str, int | None] | None = None,
        state: MixState | None = None,
    ) -> None:
        if set(streams) != set(weights):
            raise ValueError(
                f"streams {sorted(streams)} and weights {sorted(weights)} name different sources"
            )
        self.names = list(streams)
        self._streams = dict(streams)
        self._budgets = dict(budgets or {})
        counts = None
        if state is not None and set(state.counts) == set(self.names):
            counts = [state.counts[name] for name in self.names]
        self._mix = WeightedInterleave([weights[name] for name in self.names], counts)

    @property
    def state(self) -> MixState:
        return MixState(
            counts=dict(zip(self.names, self._mix.counts, strict=True)),
            streams={name: stream.state for name, stream in self._streams.items()},
        )

    @property
    def counts(self) -> dict[str, int]:
        """Prompts served per source so far (resumed counts included)."""
        return dict(zip(self.names, self._mix.counts, strict=True))

    def __iter__(self) -> MixedStream:
        return self

    def __next__(self) -> PromptItem:
        name = self.names[self._mix.next()]
        item = next(self._streams[name])
        return dataclasses.replace(item, source=name, max_response_len=self._budgets.get(name))
