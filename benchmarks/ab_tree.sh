#!/usr/bin/env bash
# Exports revision REV of this repository to .ab/REV (the code, examples and benchmark
# scripts; not the results) for benchmarks/ab_train.py; .ab/ is ignored by git, so a
# remote run needs it carried along.
# Usage: benchmarks/ab_tree.sh REV
set -eu
rev=${1:?usage: ab_tree.sh REV}
dir=".ab/$rev"
rm -rf "$dir"
mkdir -p "$dir"
git archive "$rev" hashrec examples benchmarks pyproject.toml | tar -x -C "$dir"
rm -rf "$dir/benchmarks/results"
echo "$dir"
