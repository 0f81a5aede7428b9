"""Writing a layout over the operator's TOML without losing their comments and formatting.

`merged_text(base, document)` edits `base` (the file being replaced, or the text the layout
was applied from) in place with tomlkit until it holds `document`: unchanged keys keep their
text, comments and order; a changed value is rewritten and keeps the comment at the end of its
line; removed keys and tables go, comments inside them too; new keys and instances are added
at the end of their table. The caller checks that the text reads back as the document and
falls back to a plain dump otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

import tomlkit
from tomlkit.exceptions import TOMLKitError
from tomlkit.items import AoT, InlineTable, Item, Table
from tomlkit.toml_document import TOMLDocument


def merged_text(base: str, document: Mapping[str, Any]) -> str | None:
    """`base` edited to hold `document`; None when `base` is not TOML tomlkit can edit, or
    its tables are in another order than the document's."""
    try:
        doc = tomlkit.parse(base)
        _update(doc, document, inline=False)
        return tomlkit.dumps(doc)
    except (TOMLKitError, ValueError, TypeError, KeyError):
        return None


def _plain(value: Any) -> Any:
    return value.unwrap() if hasattr(value, "unwrap") else value


def _update(table: MutableMapping[str, Any], new: Mapping[str, Any], inline: bool) -> None:
    """`table` (top level: `inline` False) edited in place until it equals `new`."""
    for key in [k for k in table if k not in new]:
        del table[key]
    for key, value in new.items():
        if key not in table:
            # a new table under the top level is written inline (`args = { ... }`)
            table[key] = _new_item(value, inline=inline or not isinstance(table, TOMLDocument))
            continue
        old = table[key]
        if isinstance(value, Mapping) and isinstance(old, Table | InlineTable):
            _update(old, value, inline=isinstance(old, InlineTable))
        elif (
            isinstance(value, list)
            and isinstance(old, AoT)
            and all(isinstance(v, Mapping) for v in value)
        ):
            _update_aot(old, value)
        elif _plain(old) != value or type(_plain(old)) is not type(value):
            table[key] = _new_item(value, inline=True)


def _update_aot(aot: AoT, new: list[Mapping[str, Any]]) -> None:
    """Tables of an array (`[[instance]]`), matched by `name` where they have one, else by
    position; the order is the new one's."""

    def key(entry: Any, index: int) -> Any:
        name = entry.get("name") if isinstance(entry, Mapping) else None
        return ("name", name) if isinstance(name, str) else ("index", index)

    old_by_key = {key(t, i): t for i, t in enumerate(aot)}
    new_keys = [key(t, i) for i, t in enumerate(new)]
    if [k for k in new_keys if k in old_by_key] != [k for k in old_by_key if k in new_keys]:
        raise ValueError("tables reordered")  # the caller writes a plain dump instead
    for i in reversed(range(len(aot))):
        if key(aot[i], i) not in new_keys:
            del aot[i]
    for k, entry in zip(new_keys, new, strict=True):
        if k in old_by_key:
            _update(old_by_key[k], entry, inline=False)
        else:
            table = tomlkit.table()
            for name, value in entry.items():
                table[name] = _new_item(value, inline=True)
            if len(aot):
                aot[-1].add(tomlkit.nl())  # a blank line before it, as between the others
            aot.append(table)


def _new_item(value: Any, inline: bool) -> Item | Any:
    """A new value; tables nested in a table become inline (`args = { ... }`), as a person
    writes them."""
    if isinstance(value, Mapping):
        if inline:
            t = tomlkit.inline_table()
            for k, v in value.items():
                t[k] = _new_item(v, inline=True)
            return t
        table = tomlkit.table()
        for k, v in value.items():
            table[k] = _new_item(v, inline=True)
        return table
    if isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
        aot = tomlkit.aot()
        for v in value:
            entry = tomlkit.table()
            for k, x in v.items():
                entry[k] = _new_item(x, inline=True)
            aot.append(entry)
        return aot
    return tomlkit.item(value)
