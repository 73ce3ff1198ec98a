"""Prompt-lookup (n-gram) drafts: propose the tokens that followed the latest earlier occurrence
of the history's last n tokens, trying n from max_n down to min_n.

`NgramProposer` keeps, per request and per n, a map from each n-gram to the latest start at which
it is followed by at least one token. The prompt is indexed once with numpy (sliding windows);
each new token adds one entry per n; a proposal is max_n - min_n + 1 lookups. So a request costs
O(history) once, then O(1) per step, instead of a Python scan of the whole history every step.

Drafts are verified by the sampler as one-hot drafts: accepted iff equal to the token plain
decoding emits at their position (docs/semantics.md), so a draft only ever changes speed, never
the tokens, greedy or seeded.
"""
from __future__ import annotations

import numpy as np

_BITS = 21                   # token ids below 2**21 pack three to an int64 key


class _History:
    """One request's tokens and, per n, n-gram -> latest start with a token after it.

    Keys are ints (ids packed 21 bits each) when n <= 3 and every id fits, else tuples."""

    def __init__(self, prompt: list[int], ns: range):
        self.tokens = list(prompt)
        self.ns = ns
        arr = np.asarray(prompt, dtype=np.int64)
        self.packed = ns.stop - 1 <= 3 and (len(arr) == 0 or int(arr.max()) < (1 << _BITS))
        self.index: dict[int, dict] = {}
        for n in ns:
            if len(arr) > n:               # starts 0 .. len - n - 1 have a follower
                windows = np.lib.stride_tricks.sliding_window_view(arr[:-1], n)
                if self.packed:
                    keys = (windows << (_BITS * np.arange(n - 1, -1, -1))).sum(axis=1).tolist()
                else:
                    keys = map(tuple, windows.tolist())
                # later starts overwrite earlier ones: the dict keeps the latest
                self.index[n] = dict(zip(keys, range(len(windows))))
            else:
                self.index[n] = {}

    def key(self, start: int, n: int):
        seq = self.tokens[start:start + n]
        if not self.packed:
            return tuple(seq)
        k = 0
        for t in seq:
            k = (k << _BITS) | t
        return k

    def extend(self, new_tokens: list[int]) -> None:
        if self.packed and max(new_tokens) >= (1 << _BITS):
            self.__init__(self.tokens + list(new_tokens), self.ns)     # re-index once with tuple keys
            return
        for token in new_tokens:
            self.tokens.append(token)
            length = len(self.tokens)
            for n, index in self.index.items():
                start = length - n - 1      # the n-gram that just gained a follower
                if start >= 0:
                    index[self.key(start, n)] = start


class NgramProposer:
    """Prompt-lookup drafts with their index kept per request id."""

    def __init__(self, *, min_n: int, max_n: int):
        self.ns = range(min_n, max_n + 1)
        self._histories: dict[str, _History] = {}

    def propose(self, req_id: str, prompt: list[int], output: list[int], k: int) -> list[int]:
        """Up to k drafts continuing prompt + output (output only ever grows for a request)."""
        hist = self._histories.get(req_id)
        if hist is None:
            hist = self._histories[req_id] = _History(prompt, self.ns)
        seen = len(hist.tokens) - len(prompt)
        if seen < len(output):
            hist.extend(output[seen:])
        if k <= 0:
            return []
        tokens, total = hist.tokens, len(hist.tokens)
        for n in reversed(self.ns):
            if n > total - 1:
                continue
            start = hist.index[n].get(hist.key(total - n, n))
            if start is not None:
                return tokens[start + n:start + n + k]
        return []

    def drop(self, req_id: str) -> None:
        self._histories.pop(req_id, None)
