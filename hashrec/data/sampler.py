"""``data_config.negative_sampler``: negative items for a match model's batches.

The item table has TorchEasyRec's schema: a row per item with ``id`` (int64), ``weight``
(a number >= 0) and ``attrs`` (the values of ``attr_fields``, in that order, joined by
``attr_delimiter``). TorchEasyRec reads it from ODPS or a local text file through
GraphLearn; HashRec reads local files: parquet (``.parquet``) or delimited text whose
first line names the columns (``id:int64<TAB>weight:float<TAB>attrs:string``, the types
after ``:`` optional; ``field_delimiter``, default tab). ``input_path`` takes files,
directories and globs as the input paths do. A training run reads it once
(``read_item_table``): its training and evaluation samplers share that read.

Each batch gets ``num_sample`` items (``num_eval_sample`` in evaluation where set), each
drawn with probability proportional to its weight, with replacement; a draw of an item
whose id is among the batch's ``item_id_field`` values is drawn again (up to
``REDRAWS`` times, so that a table of few items still fills the batch), as TorchEasyRec's
sampler avoids the batch's items. The draws come from the generator the caller passes:
the same seed gives the same negatives. The sampled rows carry the attr fields as input
columns (text cast to the input column's type; empty text read as missing; list columns
split on ``\\x1d``), every other column missing, so that item features read them and
user features see empty rows.

As in TorchEasyRec, an ``item_id_field`` of a sequence's sub-feature
(``cand_seq__video_id``, hstu_match's candidates) reads each row's ids from the
sequence (a list column, or text of ids between separators), and an attr field
(``video_id``) fills that sequence's column of the same sub-feature
(``cand_seq__video_id``; a column of its own name too, where there is one): each
sampled row a sequence of its one item.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from hashrec.data.errors import DataError
from hashrec.data.paths import expand_input_path

logger = logging.getLogger(__name__)

# Times a draw of one of the batch's own items is drawn again.
REDRAWS = 5
# Separator of a list column's values in an attr (TorchEasyRec's multi-value separator).
LIST_SEPARATOR = "\x1d"
_WHERE = "data_config.negative_sampler"
# The data_config field of each sampler message (for errors that name the field).
_FIELDS = {"NegativeSampler": "negative_sampler", "NegativeSamplerV2": "negative_sampler_v2",
           "HardNegativeSampler": "hard_negative_sampler",
           "HardNegativeSamplerV2": "hard_negative_sampler_v2"}
# Types of the columns of the sampler tables' text files where their header leaves them out.
_TEXT_TYPES = {"id": pa.int64(), "weight": pa.float64(), "attrs": pa.string(),
               "src_id": pa.int64(), "dst_id": pa.int64()}


def sampler_where(config) -> str:
    """``data_config.<field>`` of the sampler message ``config`` (for errors)."""
    return f"data_config.{_FIELDS.get(config.DESCRIPTOR.name, config.DESCRIPTOR.name)}"


def _path_field(config) -> str:
    """The field naming the item table: ``input_path`` (negative_sampler) or
    ``item_input_path`` (the samplers with user and edge tables)."""
    return "input_path" if "input_path" in config.DESCRIPTOR.fields_by_name \
        else "item_input_path"


@dataclass(frozen=True)
class ItemTable:
    """The items of a negative sampler's item table, read and checked once
    (``read_item_table``) and shared by the samplers of a run (training's and
    evaluation's draw from the same table).

    Attributes:
        source: what it was read with: (input_path, attr_fields, attr_delimiter,
            field_delimiter).
        ids: (n,) int64 item ids.
        cumulative: (n,) float64 running sum of the weights (> 0 at the end).
        attrs: attr field -> (n,) texts of the items' values.
    """

    source: tuple
    ids: np.ndarray
    cumulative: np.ndarray
    attrs: dict[str, pa.Array]


def field_delimiter(config) -> str:
    """The sampler tables' text field delimiter of ``config`` (default: tab)."""
    return config.field_delimiter if config.HasField("field_delimiter") else "\t"


def _source(config) -> tuple:
    return (getattr(config, _path_field(config)), tuple(config.attr_fields),
            config.attr_delimiter, field_delimiter(config))


def read_item_table(config) -> ItemTable:
    """The item table of the sampler message ``config`` (``NegativeSampler``, or the
    ``item_input_path`` of the samplers with edge tables), read and checked.

    Raises:
        DataError: a setting the table is read with out of range (naming the field), or an
            item table that is missing, unreadable or malformed (naming the file, column
            and row).
    """
    where = sampler_where(config)
    if not config.attr_fields:
        raise DataError(f"{where}.attr_fields is empty; list the item columns that the "
                        f"item table's attrs hold, in their order")
    if not config.attr_delimiter:
        raise DataError(f"{where}.attr_delimiter is empty; set the separator of the "
                        f"attrs (default ':')")
    source = _source(config)
    ids, weights, attrs = _load_items(*source, where=where, path_field=_path_field(config))
    return ItemTable(source, ids, np.cumsum(weights), attrs)


class NegativeSampler:
    """Items of one item table, drawn by weight.

    Args:
        config: the ``NegativeSampler`` message.
        evaluation: draw ``num_eval_sample`` items a batch where it is set.
        items: the table ``read_item_table(config)`` gave (a run reads it once for all
            its samplers); None reads it.

    Raises:
        DataError: a setting out of range (naming the field), or an item table that is
            missing, unreadable or malformed (naming the file, column and row).
        ValueError: ``items`` read with other settings than ``config``'s.
    """

    def __init__(self, config, evaluation: bool = False, items: ItemTable | None = None
                 ) -> None:
        self.where = where = sampler_where(config)
        self.num_sample = int(config.num_eval_sample) \
            if evaluation and config.HasField("num_eval_sample") else int(config.num_sample)
        if self.num_sample < 1:
            field = "num_eval_sample" if evaluation and config.HasField("num_eval_sample") \
                else "num_sample"
            raise DataError(f"{where}.{field}={self.num_sample}; allowed: 1 or more "
                            f"negative items a batch")
        if not config.item_id_field:
            raise DataError(f"{where}.item_id_field is empty; name the input column of the "
                            f"item id")
        if items is None:
            items = read_item_table(config)
        elif items.source != _source(config):
            raise ValueError(f"items read from {items.source}, not from this sampler's "
                             f"{_source(config)}")
        self.item_id_field = config.item_id_field
        self.attr_fields = items.source[1]
        self.ids, self._cumulative, self.attrs = items.ids, items.cumulative, items.attrs
        self._warned: set[str] = set()

    def sample(self, batch: pa.Table, rng: np.random.Generator) -> pa.Table:
        """The ``num_sample`` negative rows of ``batch`` (an input block): its columns, the
        attr fields from the drawn items, the others missing.

        Raises:
            DataError: ``batch`` lacks ``item_id_field``, or an attr does not convert to
                its input column's type.
        """
        rows = self.draw(self.batch_ids(batch, self.item_id_field, "item_id_field"), rng)
        return self.item_rows(batch, pa.array(rows))

    def batch_ids(self, batch: pa.Table, column: str, field: str) -> np.ndarray:
        """The ids (nulls left out) of ``batch``'s ``column``, which the sampler's
        ``field`` names.

        Raises:
            DataError: no such column, or one not of integers.
        """
        if column not in batch.column_names:
            raise DataError(f"{self.where}.{field} {column!r} is not a column of the input "
                            f"(columns: {', '.join(batch.column_names)})")
        return _ids_of(batch.column(column), f"{self.where}.{field}", column)

    def item_rows(self, batch: pa.Table, rows: pa.Array) -> pa.Table:
        """Input rows of ``batch``'s columns for the item table's ``rows`` (int64; a null
        gives a row of missing values): the attr fields from the items, the others
        missing."""
        columns = []
        filled = attr_columns(self.attr_fields, self.item_id_field, batch.column_names)
        for field in batch.schema:
            if field.name in filled:
                columns.append(as_input_type(self.attrs[filled[field.name]].take(rows), field,
                                             self.where))
            else:
                columns.append(pa.nulls(len(rows), field.type))
        unused = [f for f in self.attr_fields if f not in filled.values()
                  and f not in self._warned]
        if unused:
            self._warned.update(unused)
            logger.warning("%s.attr_fields %s are not input columns of the model's features; "
                           "they are left out (as in TorchEasyRec)", self.where, unused)
        return pa.Table.from_arrays(columns, schema=batch.schema)

    def draw(self, batch_ids: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Rows of the item table (``num_sample``,) int64: by weight, items whose id is in
        ``batch_ids`` drawn again up to ``REDRAWS`` times."""
        total = self._cumulative[-1]
        rows = np.searchsorted(self._cumulative, rng.random(self.num_sample) * total,
                               side="right")
        for _ in range(REDRAWS):
            again = np.flatnonzero(np.isin(self.ids[rows], batch_ids))
            if not len(again):
                break
            rows[again] = np.searchsorted(self._cumulative, rng.random(len(again)) * total,
                                          side="right")
        # rng.random() < 1, but total * u may round up to total
        return np.minimum(rows, len(self.ids) - 1).astype(np.int64)


def attr_columns(attr_fields, item_id_field: str, columns) -> dict[str, str]:
    """Input column -> the attr field it takes: an attr field fills the column of its
    name and, with an ``item_id_field`` of a sequence's sub-feature
    (``<sequence>__<name>``), the column ``<sequence>__<attr field>`` (TorchEasyRec's
    rule), each where there is one."""
    sequence = item_id_field.rpartition("__")[0]
    out = {}
    for attr in attr_fields:
        for column in (attr, f"{sequence}__{attr}" if sequence else ""):
            if column in columns:
                out[column] = attr
    return out


def _ids_of(column, field: str, name: str) -> np.ndarray:
    """The integer ids of an id column: a column of ids, of lists of ids, or of text
    holding ids between separators (a sequence's)."""
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        column = pc.list_flatten(column)
    elif pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        column = pc.list_flatten(pc.split_pattern_regex(column, r"[^0-9A-Za-z_\-]+"))
        column = column.filter(pc.not_equal(column, ""))
    try:
        ids = pc.cast(column, pa.int64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
        raise DataError(f"{field} {name!r}: the input column holds "
                        f"{column.type}, not integer ids ({err})") from None
    return ids.drop_null().to_numpy()


def as_input_type(values: pa.Array, field: pa.Field, where: str = _WHERE) -> pa.Array:
    """Attr texts as the input column ``field``'s type (``where``: the sampler's config
    path, for the error)."""
    if pa.types.is_string(field.type) or pa.types.is_large_string(field.type):
        return values.cast(field.type)
    present = pc.if_else(pc.equal(values, ""), pa.scalar(None, pa.string()), values)
    try:
        if pa.types.is_list(field.type) or pa.types.is_large_list(field.type):
            return pc.split_pattern(present, LIST_SEPARATOR).cast(field.type)
        return present.cast(field.type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
        raise DataError(f"{where}: attr field {field.name!r} of a sampled item does not "
                        f"convert to its input column's type {field.type}: {err}") from None


def table_files(input_path: str, where: str, table: str) -> list[str]:
    """The files of a sampler table's ``input_path`` (``where``: its field, ``table``:
    what it holds, for errors)."""
    if not input_path:
        raise DataError(f"{where} is empty; name the {table}'s files")
    try:
        return expand_input_path(input_path)
    except (OSError, ValueError) as err:
        raise DataError(f"{where} {input_path!r}: {err}") from None


def _load_items(input_path: str, attr_fields: tuple[str, ...], attr_delimiter: str,
                field_delimiter: str, where: str = _WHERE, path_field: str = "input_path"
                ) -> tuple[np.ndarray, np.ndarray, dict[str, pa.Array]]:
    """(ids, weights, attr field -> texts) of every item of the files of ``input_path``."""
    files = table_files(input_path, f"{where}.{path_field}", "item table")
    ids, weights, attrs = [], [], {name: [] for name in attr_fields}
    for path in files:
        table = read_table(path, field_delimiter, where)
        file_ids, file_weights, texts = _items_of(table, path, attr_fields, attr_delimiter,
                                                  where)
        ids.append(file_ids)
        weights.append(file_weights)
        for name, column in zip(attr_fields, texts):
            attrs[name].append(column)
    count = sum(len(i) for i in ids)
    if not count:
        raise DataError(f"{where}.{path_field} {input_path!r}: the item table has no rows")
    weight = np.concatenate(weights)
    if not weight.sum() > 0:
        raise DataError(f"{where}.{path_field} {input_path!r}: every item's weight is 0; "
                        f"weights are the items' sampling odds")
    return (np.concatenate(ids), weight,
            {name: pa.concat_arrays(parts) for name, parts in attrs.items()})


def read_table(path: str, field_delimiter: str, where: str = _WHERE,
               table: str = "item table") -> pa.Table:
    """One file of a sampler ``table``: parquet, or text whose first line names the
    columns (``name:type``, the type optional)."""
    try:
        if path.endswith(".parquet"):
            return pq.read_table(path)
        with open(path, encoding="utf-8") as f:
            header = f.readline().rstrip("\r\n")
        names = [name.split(":")[0] for name in header.split(field_delimiter)]
        return pacsv.read_csv(
            path, read_options=pacsv.ReadOptions(column_names=names, skip_rows=1),
            parse_options=pacsv.ParseOptions(delimiter=field_delimiter, quote_char=False),
            convert_options=pacsv.ConvertOptions(
                column_types={n: t for n, t in _TEXT_TYPES.items() if n in names},
                strings_can_be_null=False, quoted_strings_can_be_null=False))
    except (OSError, pa.ArrowInvalid) as err:
        raise DataError(f"{where} {table} {path}: cannot be read: {err}") from None


def _items_of(table: pa.Table, path: str, attr_fields: tuple[str, ...],
              attr_delimiter: str, where: str = _WHERE
              ) -> tuple[np.ndarray, np.ndarray, list[pa.Array]]:
    missing = [c for c in ("id", "weight", "attrs") if c not in table.column_names]
    if missing:
        raise DataError(f"{where} item table {path}: no column {', '.join(missing)}; it "
                        f"needs id (int64), weight and attrs (the attr_fields' values joined "
                        f"by attr_delimiter), as in TorchEasyRec (columns: "
                        f"{', '.join(table.column_names)})")
    try:
        ids = pc.cast(table.column("id"), pa.int64()).combine_chunks()
        weight = pc.cast(table.column("weight"), pa.float64()).combine_chunks()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
        raise DataError(f"{where} item table {path}: id must be integers and weight "
                        f"numbers: {err}") from None
    weights = weight.to_numpy(zero_copy_only=False)
    bad = np.flatnonzero(~(np.isfinite(weights) & (weights >= 0)) | _nulls(ids) |
                         _nulls(weight))
    if len(bad):
        row = int(bad[0])
        raise DataError(f"{where} item table {path} row {row}: id {ids[row].as_py()!r} "
                        f"weight {weight[row].as_py()!r}; ids must be set and weights finite "
                        f"numbers >= 0")
    parts = pc.split_pattern(pc.cast(table.column("attrs"), pa.string()).combine_chunks(),
                             attr_delimiter)
    counts = pc.list_value_length(parts).fill_null(0).to_numpy(zero_copy_only=False)
    wrong = np.flatnonzero(counts != len(attr_fields))
    if len(wrong):
        row = int(wrong[0])
        raise DataError(f"{where} item table {path} row {row}: attrs "
                        f"{table.column('attrs')[row].as_py()!r} hold {int(counts[row])} "
                        f"values split on {attr_delimiter!r}; attr_fields lists "
                        f"{len(attr_fields)} ({', '.join(attr_fields)})")
    texts = [pc.list_element(parts, i) for i in range(len(attr_fields))]
    return ids.to_numpy(), weights, texts


def _nulls(array: pa.Array) -> np.ndarray:
    return pc.is_null(array).to_numpy(zero_copy_only=False)


def _has_sampler(data_config, name: str = "negative_sampler") -> bool:
    """Whether ``data_config`` sets the sampler ``name``."""
    has_field = getattr(data_config, "HasField", None)  # a stand-in config may lack it
    return has_field is not None and has_field(name)


# The samplers of match models' negatives that read user and edge tables
# (``hashrec.data.edge_sampler``).
EDGE_SAMPLERS = ("negative_sampler_v2", "hard_negative_sampler", "hard_negative_sampler_v2")


def negative_items(data_config):
    """What the sampler of ``data_config`` draws from, read and checked: the item table of
    its ``negative_sampler`` (``read_item_table``), the tables of the samplers with edges
    (``hashrec.data.edge_sampler.read_sampler_tables``) or the tree of its
    ``tdm_sampler`` (``hashrec.data.tdm_sampler.read_tdm_tree``); None without a
    sampler."""
    if _has_sampler(data_config, "tdm_sampler"):
        from hashrec.data.tdm_sampler import read_tdm_tree  # it imports this module

        return read_tdm_tree(data_config.tdm_sampler)
    edges = _edge_sampler(data_config)
    if edges is not None:
        from hashrec.data.edge_sampler import read_sampler_tables  # it imports this module

        return read_sampler_tables(getattr(data_config, edges))
    if not _has_sampler(data_config):
        return None
    return read_item_table(data_config.negative_sampler)


def _edge_sampler(data_config) -> str | None:
    return next((name for name in EDGE_SAMPLERS if _has_sampler(data_config, name)), None)


def negative_sampler(data_config, mode: str, items=None):
    """The sampler of ``data_config``'s negatives (any of the match models' samplers, or
    its ``tdm_sampler``) for a ``mode`` loader (train or eval; none for predict, whose
    rows are scored as they are); None without one. ``items``: what ``negative_items``
    gave (read already); None reads it."""
    if mode == "predict":
        return None
    if _has_sampler(data_config, "tdm_sampler"):
        from hashrec.data.tdm_sampler import TDMSampler

        return TDMSampler(data_config.tdm_sampler, data_config.label_fields, tree=items)
    edges = _edge_sampler(data_config)
    if edges is not None:
        from hashrec.data.edge_sampler import EdgeNegativeSampler

        return EdgeNegativeSampler(getattr(data_config, edges), evaluation=mode == "eval",
                                   tables=items)
    if not _has_sampler(data_config):
        return None
    return NegativeSampler(data_config.negative_sampler, evaluation=mode == "eval",
                           items=items)
