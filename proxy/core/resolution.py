"""Model resolution: served names, roots and aliases in; a requested name -> a served name out."""

from __future__ import annotations

import bisect
import difflib
import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Rule names double as the `rule` label of vllm_sidecar_model_resolutions_total.
EXACT, ALIAS, ROOT, BASENAME, CASE = "exact", "alias", "root", "basename", "case"
UNRESOLVED, AMBIGUOUS, ABSENT = "unresolved", "ambiguous", "absent"
RULES = (EXACT, ALIAS, ROOT, BASENAME, CASE, UNRESOLVED, AMBIGUOUS, ABSENT)


@dataclass(frozen=True, slots=True)
class ServedModel:
    id: str
    root: str | None = None

    @property
    def group(self) -> str:
        """Served names loaded from one root are one model (`--served-model-name a b`)."""
        return self.root or self.id


@dataclass(frozen=True, slots=True)
class Resolution:
    requested: str
    served: str | None
    rule: str
    candidates: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return self.served is not None and self.served != self.requested


def basename(name: str) -> str:
    """`Qwen/Qwen2.5-0.5B` and `/data/ckpt/Qwen2.5-0.5B/` -> `Qwen2.5-0.5B`."""
    return name.rstrip("/").rsplit("/", 1)[-1]


# difflib is quadratic in the worst case: names are compared by their first characters only
# (real names are shorter), so a suggestion costs well under a millisecond.
_SUGGEST_CHARS = 128


def _comparable(name: str) -> str:
    return basename(name[:4096]).casefold()[:_SUGGEST_CHARS]


# Up to this many served names, a suggestion compares them all. Past it (thousands of LoRA
# adapters), only the names nearest in sort order by their front and by their back: names
# that share a prefix or a suffix, which is where a typo's neighbours are. A suggestion then
# costs a bounded few hundred comparisons however many names are served (50,001 names and
# every one compared held the loop for seconds).
SUGGEST_ALL = 256
_NEAR = 64  # on each side, in each order


# Resolutions a table remembers (names are capped in length: InvalidRequest past it).
MEMO = 1024

# key -> {model group -> served name}; more than one group under a key is an ambiguity.
_Index = dict[str, dict[str, str]]


def _add(index: _Index, key: str, group: str, served: str) -> None:
    if key:
        index.setdefault(key, {}).setdefault(group, served)


def _folded(index: _Index) -> _Index:
    out: _Index = {}
    for key, hits in index.items():
        for group, served in hits.items():
            _add(out, key.casefold(), group, served)
    return out


class ModelTable:
    """A lookup built once per discovery; `resolve` is a few dict lookups, then one."""

    def __init__(
        self,
        served: Sequence[ServedModel],
        aliases: Mapping[str, str] | None = None,
        *,
        case_insensitive: bool = True,
    ) -> None:
        self.served = tuple(served)
        self.names = tuple(m.id for m in self.served)  # built once: every answer's envelope
        self.aliases = dict(aliases or {})
        self.case_insensitive = case_insensitive
        groups = {m.id: m.group for m in self.served}
        exact: _Index = {}
        alias: _Index = {}
        root: _Index = {}
        base: _Index = {}
        for m in self.served:
            _add(exact, m.id, m.group, m.id)
            if m.root:
                _add(root, m.root, m.group, m.id)
                _add(base, basename(m.root), m.group, m.id)
            _add(base, basename(m.id), m.group, m.id)
        for name, target in self.aliases.items():
            _add(alias, name, groups.get(target, target), target)
        self._steps: list[tuple[str, _Index, bool]] = [
            (EXACT, exact, False),
            (ALIAS, alias, False),
            (ROOT, root, False),
            (BASENAME, base, True),
        ]
        if case_insensitive:
            self._steps += [
                (CASE, _folded(exact), False),
                (CASE, _folded(alias), False),
                (CASE, _folded(root), False),
                (CASE, _folded(base), True),
            ]
        self._memo: dict[str, Resolution] = {}
        if len(self.names) > SUGGEST_ALL:
            # The suggestions' sorted orders are built with the table (in discovery's thread for
            # a large list), not by the first unknown name: 50,001 names took the loop 0.17 s.
            _ = self._sorted

    def resolve(self, name: str) -> Resolution:
        """The name's resolution, worked out once per table: a trainer asks for one name, or a
        few, thousands of times. The first `MEMO` names are remembered; others, such as a
        client's stream of made-up names, are worked out each time and displace nothing."""
        res = self._memo.get(name)
        if res is None:
            res = self._resolve(name)
            if len(self._memo) < MEMO:
                self._memo[name] = res
        return res

    def _resolve(self, name: str) -> Resolution:
        folded = name.casefold()
        for rule, index, by_basename in self._steps:
            key = folded if rule == CASE else name
            hits = index.get(basename(key) if by_basename else key)
            if not hits:
                continue
            if len(hits) > 1:
                return Resolution(name, None, AMBIGUOUS, tuple(hits.values()))
            return Resolution(name, next(iter(hits.values())), rule)
        return Resolution(name, None, UNRESOLVED)

    def suggestions(self, name: str, limit: int = 3) -> tuple[str, ...]:
        """The served names closest to `name`, for error messages; a bounded amount of work."""
        wanted = _comparable(name)
        pool = range(len(self.names)) if len(self.names) <= SUGGEST_ALL else self._near(wanted)
        matcher = difflib.SequenceMatcher(None, b="")
        matcher.set_seq2(wanted)  # difflib caches what it learns of seq2
        scored = []
        for i in pool:
            matcher.set_seq1(self._comparables[i])
            scored.append((-matcher.ratio(), i))
        scored.sort()  # best first; equal scores in served order
        picked = (self.names[i] for score, i in scored if score <= -0.4)
        return tuple(dict.fromkeys(picked))[:limit]

    @functools.cached_property
    def _comparables(self) -> list[str]:
        return [_comparable(n) for n in self.names]

    @functools.cached_property
    def _sorted(self) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
        """(front, index) and (reversed, index), sorted: built at the first suggestion."""
        front = sorted((c, i) for i, c in enumerate(self._comparables))
        back = sorted((c[::-1], i) for i, c in enumerate(self._comparables))
        return front, back

    def _near(self, wanted: str) -> Iterable[int]:
        near: set[int] = set()
        for order, key in zip(self._sorted, (wanted, wanted[::-1]), strict=True):
            at = bisect.bisect_left(order, (key, -1))
            near.update(i for _, i in order[max(at - _NEAR, 0) : at + _NEAR])
        return sorted(near)

    def describe(self) -> dict[str, Any]:
        """The table as the admin `/models` endpoint shows it."""
        models: dict[str, dict[str, Any]] = {
            m.id: {"id": m.id, "root": m.root, "aliases": []} for m in self.served
        }
        ambiguous: list[dict[str, Any]] = []
        seen: set[tuple[str, str]] = set()
        for rule, index, by_basename in self._steps:
            for key, hits in index.items():
                shown = f"*/{key}" if by_basename else key
                if len(hits) > 1:
                    ambiguous.append(
                        {"alias": shown, "rule": rule, "candidates": list(hits.values())}
                    )
                    continue
                target = next(iter(hits.values()))
                if shown == target or (shown, target) in seen:
                    continue
                seen.add((shown, target))
                entry = models.setdefault(target, {"id": target, "root": None, "aliases": []})
                entry["aliases"].append({"alias": shown, "rule": rule})
        return {
            "served": list(models.values()),
            "ambiguous": ambiguous,
            "case_insensitive": self.case_insensitive,
        }


def parse_models_list(payload: Any) -> list[ServedModel]:
    """vLLM's `GET /v1/models` body -> served models; raises ValueError on another shape."""
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list):
        raise ValueError("expected an object with a `data` list")
    out = []
    for item in data:
        if not isinstance(item, dict) or not isinstance(item.get("id"), str):
            raise ValueError(f"model entry without a string `id`: {item!r:.200}")
        root = item.get("root")
        out.append(ServedModel(item["id"], root if isinstance(root, str) else None))
    return out
