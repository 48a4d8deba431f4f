"""The name a user probably meant, for a key, flow or node name that is not one.

A typo (`windw`, `ho_rwa`) is answered with the closest known name, so the one-line error
says what to type instead; a name close to nothing gets no guess.
"""

from __future__ import annotations

import difflib
import types
from collections.abc import Iterable, Sequence
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel

# Above difflib's default (0.6), which offers `plant_b` for `lab`: `windw` -> `window`,
# `ho_rwa` -> `ho_raw`, `lkae` -> `lake`; `colour` and `lab` get no guess.
_CUTOFF = 0.7


def closest(name: str, known: Iterable[str]) -> str | None:
    """The known name most like `name`, or None when none is close."""
    found = difflib.get_close_matches(name, [str(each) for each in known], n=1, cutoff=_CUTOFF)
    return found[0] if found else None


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """`; did you mean X?` naming the closest known name, or '' when none is close."""
    found = closest(name, known)
    return f"; did you mean {found}?" if found is not None else ""


def keys_at(model: type[BaseModel], loc: Sequence[object]) -> list[str]:
    """The keys the mapping at `loc` (a pydantic error's location, without the unknown key
    itself) takes, walking the model's annotations; [] where `loc` leads to no model.

    A discriminated union's branch is a part of the location (`flows.f.tag_history.x`),
    matched by its tag; an optional (`X | None`) is not."""
    node: Any = model
    parts = list(loc)
    while True:
        node = _unwrapped(node)
        if isinstance(node, type) and issubclass(node, BaseModel):
            if not parts:
                return [field.alias or name for name, field in node.model_fields.items()]
            key = str(parts.pop(0))
            field = node.model_fields.get(key) or _by_alias(node, key)
            if field is None:
                return []
            node = field.annotation
        elif not parts:
            return []
        elif get_origin(node) in (dict, list):
            parts.pop(0)
            node = get_args(node)[-1]
        elif _is_union(node):
            node = _branch(node, str(parts.pop(0)))
        else:
            return []


def _by_alias(model: type[BaseModel], key: str) -> Any:
    return next((f for f in model.model_fields.values() if f.alias == key), None)


def _unwrapped(node: Any) -> Any:
    """`node` without Annotated[...] and without the None of an optional."""
    while get_origin(node) is Annotated:
        node = get_args(node)[0]
    if _is_union(node):
        members = [each for each in get_args(node) if each is not type(None)]
        if len(members) == 1:
            return _unwrapped(members[0])
    return node


def _is_union(node: Any) -> bool:
    return get_origin(node) in (Union, types.UnionType)


def _branch(union: Any, tag: str) -> Any:
    """The member of a union that pydantic names `tag` in a location: by its Tag(...), its
    `type`/`kind` literal, or its class name."""
    for member in get_args(union):
        names = {_tag_of(member)}
        plain = _unwrapped(member)
        if isinstance(plain, type) and issubclass(plain, BaseModel):
            names.add(plain.__name__)
            for key in ("type", "kind"):
                field = plain.model_fields.get(key)
                if field is not None:
                    names.update(str(each) for each in get_args(field.annotation))
                    names.add(str(field.default))
        if tag in names:
            return plain
    return None


def _tag_of(member: Any) -> str | None:
    if get_origin(member) is not Annotated:
        return None
    return next((str(m.tag) for m in get_args(member)[1:] if hasattr(m, "tag")), None)
