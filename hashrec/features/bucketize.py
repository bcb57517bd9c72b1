"""Tokens -> int64 ids: num_buckets, hash_bucket_size, vocabularies, dynamic (raw) ids.

Hashing is xxhash64 of the token's UTF-8 text (an integer token is hashed by its decimal
text, so ``123``, ``123.0``, ``"123.0"`` and ``"123"`` agree: ``tokens.token_text``),
stable across processes and runs. Dynamic-embedding features keep integer ids as they
are (an integral float too); a string token that is the canonical decimal text of an
integer in the int64 range (``"12"``, ``"-3"``, ``"0"``, or that with a zero fraction:
``"12.0"``) is read as that integer and any other string is replaced by its 64-bit hash,
so a sequence column of ``"12|7"`` strings and an int64 column name the same keys while
``"012"``, ``"+12"`` and ``"-0"`` stay keys of their own, as distinct strings (a uint64
id past the int64 range is hashed like its text). Which of the two a token gets depends
on the token alone, never on the other tokens of its batch. num_buckets features, which
take integers only, read any decimal integer text (``"+7"``, ``"007"``: 7).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from hashrec.config.errors import ConfigError
from hashrec.features.errors import FeatureError
from hashrec.features.tokens import (
    Bags,
    integral_floats,
    integral_text,
    string_bytes,
    token_text,
)
from hashrec.features.xxh64 import xxh64_tokens

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

logger = logging.getLogger("hashrec.features")


def _is_text(kind: pa.DataType) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def hash_tokens(values: pa.Array) -> np.ndarray:
    """xxhash64 of every token's text: (n,) arrow array -> (n,) int64 (two's complement)."""
    return _hash_text(token_text(values))


def _hash_text(text: pa.Array) -> np.ndarray:
    """``hash_tokens`` of a string array already in ``token_text`` form."""
    if len(text) == 0:
        return np.zeros(0, dtype=np.int64)
    encoded = pc.dictionary_encode(text)  # each distinct token hashed once
    digests = xxh64_tokens(encoded.dictionary).view(np.int64)
    return digests[encoded.indices.to_numpy(zero_copy_only=False)]


def error_at(bags: Bags, position: int, feature: str, column: str, what: str) -> FeatureError:
    value = bags.values[position].as_py()
    return FeatureError(f"feature {feature!r}: column {column!r}", bags.row_of(position),
                        f"{what} (value {value!r})")


def _no_letters(values: pa.Array) -> bool:
    """Whether no byte of a string array's tokens lies above ``9`` in ASCII (no letter, no
    multi-byte character): the tokens may all be integer texts. One max over the bytes,
    cheap beside a cast (a table lookup a byte cost 100x as much)."""
    data = string_bytes(values)[1]
    return len(data) > 0 and int(data.max()) <= ord("9")


def _integer_text(values: pa.Array, canonical: bool) -> np.ndarray:
    """(n,) bool: which tokens of a string array are decimal integer texts, read from the
    data buffer's bytes (null cells are not). ``canonical``: an integer's canonical text
    (``^(0|-?[1-9][0-9]*)$``: ASCII digits after an optional ``-``, no leading zero, no
    ``-0``); else any decimal integer text (``^[+-]?[0-9]+$``)."""
    offsets, data = string_bytes(values)
    if not len(data):  # no token holds a byte
        return np.zeros(len(values), dtype=bool)
    starts, lengths = offsets[:-1], np.diff(offsets)
    nondigits = np.concatenate(([0], np.cumsum((data < 48) | (data > 57), dtype=np.int64)))
    bad = nondigits[starts + lengths] - nondigits[starts]
    last = len(data) - 1
    first = data[np.minimum(starts, last)]
    signs = (ord("-"),) if canonical else (ord("-"), ord("+"))
    signed = (lengths >= 2) & np.isin(first, signs)
    is_int = (lengths >= 1) & ((bad == 0) | ((bad == 1) & signed))
    if canonical:  # the first digit is a 0 only in "0"
        lead = data[np.minimum(starts + signed, last)]
        is_int &= (lead != ord("0")) | ((lengths == 1) & ~signed)
    if values.null_count:
        is_int &= pc.is_valid(values).to_numpy(zero_copy_only=False)
    return is_int


def _zero_led(values: pa.Array) -> bool:
    """Whether a token of a string array starts with ``+`` or (being longer than one
    byte) ``0``, or with ``-0``: one that no canonical integer text does."""
    offsets, data = string_bytes(values)
    if not len(data):
        return False
    starts, lengths = offsets[:-1], np.diff(offsets)
    if int(lengths.min()) == 0:  # an empty token has no first byte
        starts, lengths = starts[lengths > 0], lengths[lengths > 0]
    first = data[starts]
    if bool((first == ord("+")).any()):
        return True
    # Few tokens start with 0 or - and are longer than one byte: test those alone.
    led = np.flatnonzero(((first == ord("0")) | (first == ord("-"))) & (lengths >= 2))
    if not led.size:
        return False
    return bool(((first[led] == ord("0")) | (data[starts[led] + 1] == ord("0"))).any())


def int_tokens(values: pa.Array, canonical: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Which string tokens are integer ids in the int64 range, and their values.

    ``canonical`` (dynamic keys): a token is one when it is an integer's canonical decimal
    text, or that with a zero fraction (``"12"``, ``"-3"``, ``"12.0"``; not ``"012"``,
    ``"+12"``, ``"-0"``); else (num_buckets) any decimal integer text, with or without a
    zero fraction.

    A column with no byte above ``9`` (the common case: integer ids stored as text), and
    in canonical mode none led by ``+``, ``0`` or ``-0`` (``_zero_led``), is cast whole, as
    one Arrow cast, which fails on anything else it holds (a space, a stray sign, an
    overflow), leaving it to the token-wise path. There, which tokens are integer texts is
    read from their bytes (``_integer_text``) and only those are cast, so that no cast of
    a column of other strings (hex ids, say) runs to its failure, which took most of a
    Criteo-like batch's parsing.

    Returns:
        (is_int (n,) bool, ints (n,) int64): ``ints`` holds the value where ``is_int``.
    """
    return _text_ints(integral_text(values, canonical), canonical)


def _text_ints(values: pa.Array, canonical: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """``int_tokens`` of a string array already in ``integral_text`` form."""
    if len(values) and not values.null_count and _no_letters(values) \
            and not (canonical and _zero_led(values)):
        try:  # every token an integer text, in one cast
            ints = pc.cast(values, pa.int64()).to_numpy(zero_copy_only=False)
            return np.ones(len(values), dtype=bool), ints
        except pa.ArrowInvalid:
            pass
    is_int = _integer_text(values, canonical)
    ints = np.zeros(len(values), dtype=np.int64)
    if not is_int.any():
        return is_int, ints
    where = np.flatnonzero(is_int)
    text = values if len(where) == len(values) else values.filter(pa.array(is_int))
    if not canonical and bool(pc.any(pc.starts_with(text, "+")).as_py()):
        text = pc.replace_substring_regex(text, r"^\+", "")  # Arrow's cast reads no "+"
    try:
        ints[where] = pc.cast(text, pa.int64()).to_numpy(zero_copy_only=False)
    except pa.ArrowInvalid:  # some overflow int64: those are not integer ids
        parsed = [int(t) for t in text.to_pylist()]
        fits = np.array([_INT64_MIN <= v <= _INT64_MAX for v in parsed], dtype=bool)
        ints[where[fits]] = [v for v, ok in zip(parsed, fits) if ok]
        is_int[where[~fits]] = False
    return is_int, ints


def _float_ids(bags: Bags) -> tuple[np.ndarray, int | None]:
    """(ids (n,) int64, position of the first float that is not an integer id or None):
    integral floats read as the integer they hold."""
    ids, ok = integral_floats(bags.values)
    return ids, None if ok.all() else int(np.flatnonzero(~ok)[0])


def strict_int_ids(bags: Bags, feature: str, column: str) -> np.ndarray:
    """Integer tokens as int64 (integral floats, and any decimal integer text with or
    without a zero fraction: ``"+7"``, ``"007.0"``); other floats or non-integer strings
    are errors naming the row."""
    values = bags.values
    if pa.types.is_integer(values.type):
        return values.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    if pa.types.is_floating(values.type):
        ids, bad = _float_ids(bags)
        if bad is not None:
            raise error_at(bags, bad, feature, column, "expected an integer id")
        return ids
    if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
        is_int, ints = int_tokens(values, canonical=False)  # "007" is 7: only ints are ids
        if not is_int.all():
            pos = int(np.flatnonzero(~is_int)[0])
            raise error_at(bags, pos, feature, column, "expected an integer id")
        return ints
    raise FeatureError(f"feature {feature!r}: column {column!r} holds {values.type}; "
                       f"expected integer ids (or strings of them)")


def ids_below(bags: Bags, feature: str, column: str, limit: int, span: str) -> np.ndarray:
    """Integer tokens (``strict_int_ids``) that must lie in [0, ``limit``); one outside
    is an error naming its row and ``span`` (how the config says the range)."""
    ids = strict_int_ids(bags, feature, column)
    bad = (ids < 0) | (ids >= limit)
    if bad.any():
        pos = int(np.flatnonzero(bad)[0])
        raise error_at(bags, pos, feature, column, f"id outside {span}")
    return ids


def raw_int64_ids(bags: Bags) -> np.ndarray:
    """Dynamic ids: integers kept (integral floats too), an integer's canonical decimal
    text parsed (``"12"``, ``"12.0"``), other strings hashed (``"012"``, ``"+12"``)."""
    values = bags.values
    if pa.types.is_integer(values.type):
        ints = values.to_numpy(zero_copy_only=False)
        if ints.dtype == np.uint64 and len(ints) and int(ints.max()) > _INT64_MAX:
            # past int64 an id's text is hashed (``int_tokens``): so is its integer
            big = ints > np.uint64(_INT64_MAX)
            ids = ints.astype(np.int64)
            ids[big] = hash_tokens(values.filter(pa.array(big)))
            return ids
        return ints.astype(np.int64, copy=False)
    if pa.types.is_floating(values.type):
        ids, bad = _float_ids(bags)
        if bad is not None:
            raise FeatureError(f"row {bags.row_of(bad)}: float id {values[bad].as_py()!r} is "
                               f"not an integer; cast the column to int64 or string")
        return ids
    if not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)):
        raise FeatureError(f"ids of type {values.type} are not supported; use int64 or string")
    text = integral_text(values)  # once, for the integers and the hashes both
    is_int, ints = _text_ints(text)
    if is_int.all():
        return ints
    ids = _hash_text(text)
    ids[is_int] = ints[is_int]
    return ids


@dataclass(frozen=True)
class NumBuckets:
    """Ids are given: every id must lie in [0, num_buckets)."""

    num_buckets: int

    @property
    def num_rows(self) -> int:
        return self.num_buckets

    def ids(self, bags: Bags, feature: str, column: str) -> np.ndarray:
        return ids_below(bags, feature, column, self.num_buckets,
                         f"[0, num_buckets={self.num_buckets})")


@dataclass(frozen=True)
class HashBuckets:
    """Ids are ``xxhash64(token) mod hash_bucket_size``."""

    hash_bucket_size: int

    @property
    def num_rows(self) -> int:
        return self.hash_bucket_size

    def ids(self, bags: Bags, feature: str, column: str) -> np.ndarray:
        hashed = hash_tokens(bags.values).view(np.uint64)
        return (hashed % np.uint64(self.hash_bucket_size)).astype(np.int64)


@dataclass(frozen=True)
class Vocab:
    """Ids from a vocabulary; out-of-vocabulary tokens get ``oov_id``.

    Without ``default_bucketize_value`` (TorchEasyRec's convention) vocab_list
    entry i gets id i + 2, the feature's default_value (what missing cells
    read as) gets id 0 and out-of-vocabulary tokens id 1; with it, entry i
    gets id i and unknown tokens get default_bucketize_value. vocab_dict maps
    tokens to the ids it names (and, without default_bucketize_value, the
    default_value to 0 and unknown tokens to 1).

    ``entries`` / ``entry_ids`` are the configured vocabulary before the default_value
    took id 0, and ``default_at_zero`` says whether it does (no default_bucketize_value):
    ``with_default`` reads the same vocabulary for a feature of another default_value.
    """

    tokens: tuple[str, ...]
    token_ids: tuple[int, ...]
    oov_id: int
    num_rows: int = field(default=0)
    entries: tuple[str, ...] = ()
    entry_ids: tuple[int, ...] = ()
    default_at_zero: bool = True

    def ids(self, bags: Bags, feature: str, column: str) -> np.ndarray:
        text = token_text(bags.values)
        index = pc.index_in(text, value_set=pa.array(self.tokens, pa.string()))
        table = np.append(np.asarray(self.token_ids, dtype=np.int64), self.oov_id)
        return table[pc.fill_null(index, len(self.tokens)).to_numpy(zero_copy_only=False)]

    def with_default(self, default_value: str) -> Vocab:
        """This vocabulary as a feature whose default_value is ``default_value`` reads it
        (that default id 0 where this one's default is): what a sequence sub-feature that
        shares a top-level feature's vocabulary reads, as if it repeated the vocabulary in
        its own config. The ids of the entries, the OOV id and the rows stay."""
        return _vocab_of(self.entries, self.entry_ids,
                         None if self.default_at_zero else self.oov_id, default_value)


@dataclass(frozen=True)
class DynamicIds:
    """Ids are the raw keys of a dynamic table (see :func:`raw_int64_ids`)."""

    @property
    def num_rows(self) -> None:
        return None

    def ids(self, bags: Bags, feature: str, column: str) -> np.ndarray:
        try:
            return raw_int64_ids(bags)
        except FeatureError as err:
            raise FeatureError(f"feature {feature!r}: column {column!r}: {err}") from None


Bucketizer = NumBuckets | HashBuckets | Vocab | DynamicIds


def _vocab(cfg, feature: str, default_value: str) -> Vocab:
    has_default = "default_bucketize_value" in cfg.DESCRIPTOR.fields_by_name and \
        cfg.HasField("default_bucketize_value")
    if len(cfg.vocab_list):
        tokens = tuple(cfg.vocab_list)
        first = 0 if has_default else 2
        token_ids = tuple(range(first, first + len(tokens)))
    else:
        tokens = tuple(cfg.vocab_dict.keys())
        token_ids = tuple(int(cfg.vocab_dict[t]) for t in tokens)
        if not has_default:
            _warn_reserved_ids(tokens, token_ids, feature, default_value)
    if len(set(tokens)) != len(tokens):
        raise ConfigError(f"feature {feature!r}: vocabulary has duplicate entries")
    return _vocab_of(tokens, token_ids, int(cfg.default_bucketize_value) if has_default else None,
                     default_value)


def _warn_reserved_ids(tokens: tuple[str, ...], token_ids: tuple[int, ...], feature: str,
                       default_value: str) -> None:
    """Warn of vocab_dict entries on the rows that, without default_bucketize_value, the
    out-of-vocabulary tokens (id 1) and a non-empty default_value (id 0) read, as
    TorchEasyRec warns of ids below 2: such an entry trains one row with them."""
    rows = {0: "the default_value's row", 1: "the out-of-vocabulary tokens' row"}
    shared = [f"{token!r} on id {i}, {rows[i]}" for token, i in zip(tokens, token_ids)
              if token != default_value and (i == 1 or (i == 0 and default_value))]
    if shared:
        logger.warning(
            "feature %r: vocab_dict puts %s, which it then shares; without "
            "default_bucketize_value ids 0 and 1 are those rows (as in TorchEasyRec): start "
            "the ids at 2 or set default_bucketize_value", feature, "; ".join(shared))


def _vocab_of(entries: tuple[str, ...], entry_ids: tuple[int, ...], bucketize_default: int | None,
              default_value: str) -> Vocab:
    """Vocab of configured entries; ``bucketize_default`` None: the default_value is id 0
    and unknown tokens id 1."""
    tokens, token_ids = entries, entry_ids
    if bucketize_default is None and default_value:
        keep = [i for i, t in enumerate(tokens) if t != default_value]
        tokens = (default_value, *(tokens[i] for i in keep))
        token_ids = (0, *(token_ids[i] for i in keep))
    oov = 1 if bucketize_default is None else bucketize_default
    num_rows = max([oov, *token_ids, 1]) + 1
    return Vocab(tokens, token_ids, oov, num_rows, entries, entry_ids, bucketize_default is None)


def bucketizer_from_config(cfg, feature: str, required: bool = True,
                           default_value: str | None = None) -> Bucketizer | None:
    """The bucketizer an id/combo feature config asks for.

    Exactly one of hash_bucket_size, num_buckets, vocab_list, vocab_dict,
    dynamicemb and zch must be set; with ``required=False`` none may be set (returns
    None: the caller inherits one). ``default_value``: the feature's default where it is
    not the config's (a sequence's ``"0"``), for the vocabularies' id 0.
    """
    fields = cfg.DESCRIPTOR.fields_by_name
    chosen = [name for name in ("hash_bucket_size", "num_buckets", "dynamicemb", "zch")
              if name in fields and cfg.HasField(name)]
    chosen += [name for name in ("vocab_list", "vocab_dict")
               if name in fields and len(getattr(cfg, name))]
    if len(chosen) > 1:
        raise ConfigError(f"feature {feature!r}: set only one of {', '.join(chosen)}")
    if not chosen:
        if required:
            raise ConfigError(f"feature {feature!r}: set one of hash_bucket_size, num_buckets, "
                              f"vocab_list, vocab_dict, dynamicemb or zch")
        return None
    kind = chosen[0]
    if kind in ("hash_bucket_size", "num_buckets") and getattr(cfg, kind) <= 0:
        raise ConfigError(f"feature {feature!r}: {kind} must be > 0, got {getattr(cfg, kind)}")
    if kind == "hash_bucket_size":
        return HashBuckets(int(cfg.hash_bucket_size))
    if kind == "num_buckets":
        return NumBuckets(int(cfg.num_buckets))
    if kind == "dynamicemb":
        return DynamicIds()
    if kind == "zch":
        from hashrec.features.zch import ZchIds, zch_options  # zch builds on this module

        return ZchIds(zch_options(cfg.zch, feature))
    return _vocab(cfg, feature, cfg.default_value if default_value is None else default_value)
