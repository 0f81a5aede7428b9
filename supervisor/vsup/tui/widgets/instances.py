"""The instances table, updated by diff: only changed cells are touched, rows come and go
by key, the order changes only when the sort says so, and the cursor stays on its instance."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Self

from rich.style import Style
from rich.text import Text
from textual._types import SegmentLines
from textual.cache import LRUCache
from textual.geometry import Region
from textual.widgets import DataTable
from textual.widgets.data_table import ColumnKey, RowKey

from vsup.snapshot import InstanceStatus
from vsup.tui import rows
from vsup.tui.rows import Cell, Column, Row


class InstanceTable(DataTable):
    """One row per instance; row keys are instance names."""

    DEFAULT_CSS = """
    InstanceTable { height: 1fr; }
    """

    _row_refresh_only = False  # set while update_cell runs (DataTable refreshes in __init__)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=False, **kwargs)
        self.columns_shown: tuple[Column, ...] = ()
        self._rows: dict[str, Row] = {}
        self._order: list[str] = []
        # id of each row's name cell -> row key: DataTable.sort's key function sees only cells
        self._name_cells: dict[int, tuple[str, Text]] = {}
        self._cell_lines: LRUCache[tuple, tuple[object, list]] = LRUCache(8192)
        # name -> ((status, over the GPU), row): rows of unchanged instances
        self._row_of: dict[str, tuple[tuple[InstanceStatus, bool], Row]] = {}
        self.updates = 0  # cells touched since mount (tests and benchmarks read it)

    def set_columns(self, columns: Sequence[Column]) -> None:
        """Switch the column set (narrow/wide, GPU/CPU node): the table starts over."""
        columns = tuple(columns)
        if columns == self.columns_shown:
            return
        self.clear(columns=True)
        self._rows.clear()
        self._order.clear()
        self._name_cells.clear()
        self._row_of.clear()
        self.columns_shown = columns
        for col in columns:
            label = Text(col.label, justify="right" if col.right else "left")
            self.add_column(label, width=col.width, key=col.key)

    def update_cell(
        self,
        row_key: RowKey | str,
        column_key: ColumnKey | str,
        value: Any,
        *,
        update_width: bool = False,
    ) -> None:
        """DataTable.update_cell, repainting only that cell's row: DataTable repaints the
        whole table for any cell, so a refresh where a few values moved cost every row."""
        self._row_refresh_only = True
        try:
            super().update_cell(row_key, column_key, value, update_width=update_width)
        finally:
            self._row_refresh_only = False
        self.refresh_row(self.get_row_index(row_key))

    def refresh(self, *regions: Region, **kwargs: Any) -> Self:
        if self._row_refresh_only and not regions and not kwargs:
            return self  # update_cell's whole-table repaint; the row is refreshed instead
        return super().refresh(*regions, **kwargs)

    def _render_cell(
        self,
        row_index: int,
        column_index: int,
        base_style: Style,
        width: int,
        cursor: bool = False,
        hover: bool = False,
    ) -> SegmentLines:
        # DataTable keys its cell cache on a table-wide update counter, so one update_cell
        # re-renders every visible cell. update_cell here always stores a new Text, so a cell
        # whose object is unchanged renders as before: cache by the cell object instead.
        if column_index < 0:
            return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        column_key = self._column_locations.get_key(column_index)
        # row -1 is the header: its cells are the column labels
        row_key = None if row_index < 0 else self._row_locations.get_key(row_index)
        if column_key is None or (row_index >= 0 and row_key is None):
            # a location DataTable does not map to a cell: nothing to cache it by
            return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        if row_key is None:
            cell = self.columns[column_key].label
        else:
            cell = self._data[row_key][column_key]
        key = (
            row_key,
            column_key,
            base_style,
            width,
            cursor,
            hover,
            self._show_hover_cursor,
            self._pseudo_class_state,
        )
        cached = self._cell_lines.get(key)
        if cached is not None and cached[0] is cell:
            return cached[1]
        lines = super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        self._cell_lines[key] = (cell, lines)
        return lines

    def _text(self, col: Column, cell: Cell) -> Text:
        return Text(
            cell[0],
            style=cell[1],
            justify="right" if col.right else "left",
            no_wrap=True,
            overflow="ellipsis",
        )

    @property
    def order(self) -> list[str]:
        return list(self._order)

    @property
    def selected_name(self) -> str | None:
        if not self._order or self.cursor_row < 0 or self.cursor_row >= len(self._order):
            return None
        return self._order[self.cursor_row]

    def show(
        self,
        instances: Sequence[InstanceStatus],
        order: Sequence[str],
        keep: str | None,
        over_plan: frozenset[str] = frozenset(),
    ) -> bool:
        """Make the table show `instances` in `order` (names; rows not in it are removed).
        `keep` is the instance the cursor stays on; `over_plan` the instances whose HBM the
        advice flags. Returns whether anything changed."""
        by_name = {i.name: i for i in instances}
        new_rows = {name: self._cells_of(by_name[name], name in over_plan) for name in order}
        diff = rows.diff_rows(self._rows, self._order, new_rows, order)
        if diff.empty:
            return False
        columns = self.columns_shown
        for name in diff.removed:
            self.remove_row(name)
        if diff.removed:
            self._name_cells = {k: v for k, v in self._name_cells.items() if v[0] in new_rows}
        touched = self._update_cells(diff.changed, columns)
        self._add_rows(diff.added, columns)
        self._rows = new_rows
        if diff.order is not None:
            position = {name: i for i, name in enumerate(order)}
            self.sort("name", key=lambda cell: position[self._name_cells[id(cell)][0]])
        self._order = list(order)
        if diff.removed or diff.added or diff.order is not None:
            self.refresh()
            self._keep_cursor(keep)
        else:
            self._repaint(touched)
        return True

    def _update_cells(
        self, changed: Sequence[tuple[str, int, Cell]], columns: Sequence[Column]
    ) -> set[str]:
        """Update the cells that changed (no row refresh each); the rows they are in."""
        touched: set[str] = set()
        self._row_refresh_only = True
        try:
            for name, index, cell in changed:
                col = columns[index]
                text = self._text(col, cell)
                if index == 0:
                    self._name_cells = {k: v for k, v in self._name_cells.items() if v[0] != name}
                    self._name_cells[id(text)] = (name, text)
                super().update_cell(name, col.key, text)
                touched.add(name)
                self.updates += 1
        finally:
            self._row_refresh_only = False
        return touched

    def _add_rows(self, added: Sequence[tuple[str, Row]], columns: Sequence[Column]) -> None:
        for name, row in added:
            cells = [self._text(c, cell) for c, cell in zip(columns, row, strict=False)]
            self._name_cells[id(cells[0])] = (name, cells[0])
            self.add_row(*cells, key=name)
            self.updates += len(row)

    def _repaint(self, touched: set[str]) -> None:
        """Repaint only the rows whose cells changed, and of those only the visible ones."""
        top = int(self.scroll_y)
        bottom = top + self.size.height
        for name in touched:
            index = self.get_row_index(name)
            if top <= index <= bottom:
                self.refresh_row(index)

    def _cells_of(self, inst: InstanceStatus, over: bool) -> Row:
        known = self._row_of.get(inst.name)
        if known is not None and known[0] == (inst, over):
            return known[1]
        row = rows.row_cells(inst, self.columns_shown, over)
        self._row_of[inst.name] = ((inst, over), row)
        return row

    def _keep_cursor(self, name: str | None) -> None:
        if name is None or name not in self._rows:
            return
        index = self._order.index(name)
        if index != self.cursor_row:
            self.move_cursor(row=index, animate=False, scroll=False)
