"""Write synthetic Criteo-like click parquet files.

Usage::

    python -m hashrec.tools.gen_criteo_data --output_dir data/criteo \\
        --num_rows 1000000 --eval_rows 100000 --num_files 4 --seed 0 --scale 0.1

Columns, as in the Criteo display-advertising data: ``label`` (int64 0/1), ``I1`` to
``I13`` (int64 counts, null where missing) and ``C1`` to ``C26`` (categorical values as
8-digit hex strings, null where missing). Rows are independent draws:

* each categorical column draws its values from a vocabulary of its own size (from a
  handful of values to ``--scale`` x 10 million) with a log-uniform law over the
  values' frequency ranks, so a few values are frequent and most are rare;
* each count column is a rounded log-normal draw;
* the label is a Bernoulli draw from a planted logistic model: an effect per value of
  eight categorical columns, one interaction of two of them, and effects of the log
  counts; the click rate is about 0.25.

Directories are handled as ``hashrec.tools.gen_taobao_data`` does them (``--eval_rows``
splits into ``train`` and ``eval``; ``_gen_criteo_data.json`` names the files written;
a directory holding other files is refused unless ``--overwrite``).
"""

from __future__ import annotations

import sys

import numpy as np
import pyarrow as pa

from hashrec.tools.gen_output import (
    Progress,
    generator_parser,
    output_dirs,
    run_generator,
    write_splits,
)

MARKER = "_gen_criteo_data.json"
DENSE = tuple(f"I{i}" for i in range(1, 14))
SPARSE = tuple(f"C{i}" for i in range(1, 27))
COLUMNS = ("label", *DENSE, *SPARSE)
# Vocabulary sizes at scale 1, of the order of the Criteo columns' (the large ones scale).
VOCAB = (1460, 583, 10_000_000, 2_200_000, 305, 24, 12_517, 633, 3, 93_145, 5_683,
         8_351_593, 3_194, 27, 14_992, 5_461_306, 10, 5_652, 2_173, 4, 7_046_547, 18, 15,
         286_181, 105, 142_572)
# Share of rows where each column is missing.
MISSING_DENSE = (0.45, 0.0, 0.2, 0.2, 0.03, 0.22, 0.04, 0.0, 0.04, 0.45, 0.04, 0.77, 0.2)
MISSING_SPARSE = (0.0, 0.0, 0.03, 0.03, 0.0, 0.12, 0.0, 0.0, 0.0, 0.0, 0.0, 0.03, 0.0,
                  0.0, 0.0, 0.03, 0.0, 0.0, 0.44, 0.44, 0.03, 0.76, 0.0, 0.03, 0.44, 0.44)
EFFECT_COLUMNS = (0, 2, 3, 5, 9, 11, 15, 20)  # C1, C3, C4, C6, C10, C12, C16, C21
INTERACTION = (0, 5)  # C1 x C6
BIAS = -1.6


def vocab_sizes(scale: float) -> tuple[int, ...]:
    """Each categorical column's vocabulary at ``scale`` (the small ones stay as they are)."""
    return tuple(v if v < 100_000 else max(100_000, round(v * scale)) if scale >= 0.01
                 else max(1_000, round(v * scale)) for v in VOCAB)


class _World:
    """The planted model: value effects of the effect columns and the count weights."""

    def __init__(self, rng: np.random.Generator, vocab: tuple[int, ...]) -> None:
        self.vocab = vocab
        self.effects = {c: rng.normal(0.0, 0.6, min(vocab[c], 1 << 22)).astype(np.float32)
                        for c in EFFECT_COLUMNS}
        self.pair = rng.normal(0.0, 0.8, (64, 64)).astype(np.float32)
        self.dense_weights = rng.normal(0.0, 0.15, len(DENSE)).astype(np.float32)
        self.dense_mu = rng.uniform(0.0, 3.0, len(DENSE))
        self.dense_sigma = rng.uniform(0.5, 1.5, len(DENSE))


def _ranks(rng: np.random.Generator, vocab: int, n: int) -> np.ndarray:
    """Frequency ranks in [0, vocab): log-uniform, so rank k comes about 1/(k+1) as often."""
    return np.minimum(np.exp(rng.random(n) * np.log(vocab + 1.0)).astype(np.int64) - 1,
                      vocab - 1)


def _hex(column: int, ranks: np.ndarray) -> np.ndarray:
    """Ranks -> 8-digit hex values, distinct per column (a multiplicative hash)."""
    mixed = (ranks.astype(np.uint64) * np.uint64(2654435761) + np.uint64(column * 40503 + 1))
    return np.char.mod("%08x", (mixed & np.uint64(0xFFFFFFFF)).astype(np.int64))


def rows_table(world: _World, rng: np.random.Generator, n: int) -> pa.Table:
    """``n`` rows of the data set."""
    logit = np.full(n, BIAS, dtype=np.float64)
    cols: dict[str, pa.Array] = {}
    for j, name in enumerate(DENSE):
        values = np.floor(rng.lognormal(world.dense_mu[j], world.dense_sigma[j], n))
        logit += world.dense_weights[j] * (np.log1p(values) - world.dense_mu[j])
        missing = rng.random(n) < MISSING_DENSE[j]
        cols[name] = pa.array(values.astype(np.int64), mask=missing)
    ranks = {}
    for c, name in enumerate(SPARSE):
        ranks[c] = _ranks(rng, world.vocab[c], n)
        missing = rng.random(n) < MISSING_SPARSE[c]
        if c in world.effects:
            effects = world.effects[c]
            logit += np.where(missing, 0.0, effects[ranks[c] % effects.size])
        cols[name] = pa.array(_hex(c, ranks[c]), pa.string(), mask=missing)
    a, b = INTERACTION
    logit += world.pair[ranks[a] % 64, ranks[b] % 64]
    label = rng.random(n) < 1.0 / (1.0 + np.exp(-logit))
    cols["label"] = pa.array(label.astype(np.int64))
    return pa.table([cols[c] for c in COLUMNS], names=list(COLUMNS))


def generate(output_dir: str, num_rows: int, num_files: int = 1, seed: int = 0,
             scale: float = 0.01, eval_rows: int = 0, row_group_size: int = 65536,
             quiet: bool = False, overwrite: bool = False) -> dict[str, list[str]]:
    """Generate the data set; return {"train"|"eval"|"data": [paths]}.

    Raises:
        GeneratorError: an output directory is a file or holds other files (nothing is
            written or deleted then).
    """
    dirs, stale = output_dirs(output_dir, eval_rows, overwrite, MARKER)
    log = Progress("gen_criteo_data", quiet)
    world_seed, rows_seed = np.random.SeedSequence(seed).spawn(2)
    world = _World(np.random.default_rng(world_seed), vocab_sizes(scale))
    rng = np.random.default_rng(rows_seed)

    def click_rate(table: pa.Table) -> str:
        ctr = float(np.mean(table.column("label").to_numpy())) if table.num_rows else 0.0
        return f", click rate {ctr:.3f}"

    return write_splits(dirs, stale, num_rows, num_files, eval_rows, MARKER, row_group_size,
                        log, lambda size: rows_table(world, rng, size), click_rate,
                        announce=True)


def _parser():
    return generator_parser("gen_criteo_data", __doc__.split("\n\n")[0], MARKER, 0.01,
                            "multiplies the large vocabularies (default 0.01; 1: Criteo "
                            "sizes, up to 10 million values a column)",
                            "also write this many rows to OUTPUT_DIR/eval (and the training "
                            "rows to OUTPUT_DIR/train)")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return run_generator("gen_criteo_data", lambda: generate(
        args.output_dir, args.num_rows, args.num_files, args.seed, args.scale, args.eval_rows,
        args.row_group_size, args.quiet, args.overwrite))


if __name__ == "__main__":
    sys.exit(main())
