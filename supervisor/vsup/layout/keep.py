"""Writing a layout over the operator's TOML without losing their comments and formatting.

`merged_text(base, document)` edits `base` (the file being replaced, or the text the layout
was applied from) in place with tomlkit until it holds `document`: unchanged keys keep their
text, comments and order; a changed value is rewritten and keeps the comment at the end of its
line; removed keys and tables go, comments inside them too; new keys and instances are added
at the end of their table. The caller checks that the text reads back as the document and
falls back to a plain dump otherwise.

tomlkit files the comment lines above a table's header (`# the second replica` above
`[[instance]]`) at the end of the table before it. So they move with the table they describe:
a removed table takes the comments above it along and leaves the ones above the table after
it in place, and a key added to a table goes above the comments of the next one.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

import tomlkit
from tomlkit.container import OutOfOrderTableProxy
from tomlkit.exceptions import TOMLKitError
from tomlkit.items import AoT, Comment, InlineTable, Item, Table, Whitespace
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


Body = list[tuple[Any, Item]]  # a table's items in file order (key None: comments, blanks)


def _tail_start(body: Body) -> int:
    """Where the comments and blank lines after a table's last key start in its body."""
    n = len(body)
    while n and body[n - 1][0] is None and isinstance(body[n - 1][1], Comment | Whitespace):
        n -= 1
    return n


def _lead_start(body: Body) -> int:
    """Where, in a table's body, the comments above the header of the table after it start:
    those after the last blank line that follows its keys (all of them without one)."""
    start = _tail_start(body)
    for i in range(len(body) - 1, start - 1, -1):
        if isinstance(body[i][1], Whitespace) and "\n" in body[i][1].as_string():
            return i + 1
    return start


def _body_of(item: Any) -> Body | None:
    """The body of a table, or of the last table of an array of tables; None for others."""
    if isinstance(item, AoT):
        item = item[-1] if len(item) else None
    return item.value.body if isinstance(item, Table) else None


def _remove_table(removed: Body, before: Body | None) -> None:
    """A table (`removed`) goes: the comments above its header (at the end of `before`, the
    table before it) go with it; those above the next table's (at its own end) stay."""
    if before is None:
        return
    lead = removed[_lead_start(removed) :]
    del before[_lead_start(before) :]
    before.extend(lead)


def _previous_body(container: Body, key: str) -> Body | None:
    """The body of the table right before `key`'s item in a container's body."""
    index = next((i for i, (k, _) in enumerate(container) if k is not None and k.key == key), 0)
    for _k, item in reversed(container[:index]):
        body = _body_of(item)
        if body is not None or not isinstance(item, Comment | Whitespace):
            return body
    return None


def _container_body(table: Any) -> Body | None:
    if isinstance(table, TOMLDocument):
        return table.body
    return table.value.body if isinstance(table, Table) else None


def _update(table: MutableMapping[str, Any], new: Mapping[str, Any], inline: bool) -> None:
    """`table` (top level: `inline` False) edited in place until it equals `new`."""
    container = _container_body(table)
    for key in [k for k in table if k not in new]:
        old = table[key]
        body = _body_of(old) if not isinstance(old, AoT) else None
        if body is not None and container is not None:
            _remove_table(body, _previous_body(container, key))
        elif isinstance(old, AoT) and len(old) and container is not None:
            _remove_table(_body_of(old) or [], _previous_body(container, key))
        del table[key]
    tail: Body = []
    if isinstance(table, Table) and any(k not in table for k in new):
        # keys added go above the comments at its end (they describe the next table)
        body = table.value.body
        start = _tail_start(body)
        tail = body[start:]
        del body[start:]
    for key, value in new.items():
        if key not in table:
            # a new table under the top level is written inline (`args = { ... }`)
            table[key] = _new_item(value, inline=inline or not isinstance(table, TOMLDocument))
            continue
        old = table[key]
        if isinstance(value, Mapping) and isinstance(
            old, Table | InlineTable | OutOfOrderTableProxy
        ):
            _update(old, value, inline=isinstance(old, InlineTable))
        elif (
            isinstance(value, list)
            and isinstance(old, AoT)
            and all(isinstance(v, Mapping) for v in value)
        ):
            before = _previous_body(container, key) if container is not None else None
            _update_aot(old, value, before)
        elif _plain(old) != value or type(_plain(old)) is not type(value):
            table[key] = _new_item(value, inline=True)
    if tail:
        table.value.body.extend(tail)  # type: ignore[attr-defined]


def _update_aot(aot: AoT, new: list[Mapping[str, Any]], before: Body | None = None) -> None:
    """Tables of an array (`[[instance]]`), matched by `name` where they have one, else by
    position; the order is the new one's. `before`: the body of the table before the array."""

    def key(entry: Any, index: int) -> Any:
        name = entry.get("name") if isinstance(entry, Mapping) else None
        return ("name", name) if isinstance(name, str) else ("index", index)

    old_by_key = {key(t, i): t for i, t in enumerate(aot)}
    new_keys = [key(t, i) for i, t in enumerate(new)]
    if [k for k in new_keys if k in old_by_key] != [k for k in old_by_key if k in new_keys]:
        raise ValueError("tables reordered")  # the caller writes a plain dump instead
    for i in reversed(range(len(aot))):
        if key(aot[i], i) not in new_keys:
            _remove_table(aot[i].value.body, aot[i - 1].value.body if i > 0 else before)
            del aot[i]
    for k, entry in zip(new_keys, new, strict=True):
        if k in old_by_key:
            _update(old_by_key[k], entry, inline=False)
        else:
            table = tomlkit.table()
            for name, value in entry.items():
                table[name] = _new_item(value, inline=True)
            lead: Body = []
            if len(aot):
                # the comments above what follows the array move below the new table
                last = aot[-1].value.body
                lead = last[_lead_start(last) :]
                del last[_lead_start(last) :]
                if not lead or not isinstance(last[-1][1], Whitespace):
                    aot[-1].add(tomlkit.nl())  # a blank line before it, as between the others
            aot.append(table)
            if lead:
                table.add(tomlkit.nl())
                table.value.body.extend(lead)


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
