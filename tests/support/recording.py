"""An environment mapping that records every name read from it (to prove
a part's settings metadata names everything its ``from_env`` reads)."""
from __future__ import annotations

from typing import Any, Iterator, Mapping


class RecordingEnv(Mapping[str, str]):
    """A read-only mapping over ``values``; ``read`` collects every key
    asked for (``get``, ``[]``, ``in``), present or not."""

    def __init__(self, values: Mapping[str, str]) -> None:
        self._values = dict(values)
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> str:
        self.read.add(key)
        return self._values[key]

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return self._values.get(key, default)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            self.read.add(key)
        return key in self._values

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)
