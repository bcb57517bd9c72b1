import os

import pytest

from hashrec.data import DataError, expand_input_path


def _touch(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "w").close()
    return os.path.abspath(path)


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "d"
    files = [_touch(str(root / n)) for n in ("b.parquet", "a.parquet", "sub/c.parquet")]
    _touch(str(root / "_SUCCESS"))
    _touch(str(root / ".a.parquet.crc"))
    return root, files


def test_directory_expands_recursively_in_sorted_order_skipping_markers(tree):
    root, (b, a, c) = tree
    assert expand_input_path(str(root)) == [a, b, c]


def test_comma_list_of_file_glob_and_directory_keeps_each_file_once(tree):
    root, (b, a, c) = tree
    got = expand_input_path(f"{b}, {root}/*.parquet ,{root}/sub")
    assert got == [b, a, c]


def test_recursive_glob(tree):
    root, (b, a, c) = tree
    assert expand_input_path(f"{root}/**/c.parquet") == [c]


@pytest.mark.parametrize("pattern", ["*", "**", "*/"], ids=["star", "recursive", "dirs"])
def test_globs_skip_hidden_files_and_markers_as_directories_do(tree, pattern):
    root, (b, a, c) = tree
    _touch(str(root / "sub" / "_SUCCESS"))
    _touch(str(root / "sub" / ".c.parquet.crc"))
    want = [a, b, c] if pattern != "*/" else [c]
    assert sorted(expand_input_path(f"{root}/{pattern}")) == want


@pytest.mark.parametrize("pattern", ["*", "**", "**/*.parquet", "*/*.parquet"])
def test_globs_skip_files_in_hidden_and_marker_directories(tree, pattern):
    # Spark writes parts under _temporary/ until its job commits
    root, (b, a, c) = tree
    _touch(str(root / "_temporary" / "0" / "part-0.parquet"))
    _touch(str(root / ".cache" / "x.parquet"))
    want = {"*": [a, b, c], "**": [a, b, c], "**/*.parquet": [a, b, c], "*/*.parquet": [c]}
    assert sorted(expand_input_path(f"{root}/{pattern}")) == want[pattern]


def test_glob_below_a_named_marker_directory_reads_it(tree):
    root, _ = tree
    part = _touch(str(root / "_staging" / "part-0.parquet"))
    assert expand_input_path(f"{root}/_staging/*.parquet") == [part]


@pytest.mark.parametrize("pattern", ["_*", ".*"], ids=["markers", "hidden"])
def test_glob_matching_only_hidden_files_and_markers_says_so(tree, pattern):
    root, _ = tree
    with pytest.raises(DataError, match=r"matches no files but 1 whose names start with"):
        expand_input_path(f"{root}/{pattern}")


def test_a_file_named_by_itself_is_read_whatever_its_name(tree):
    root, _ = tree
    assert expand_input_path(str(root / "_SUCCESS")) == [str(root / "_SUCCESS")]


def test_a_path_whose_name_holds_glob_characters_is_that_path(tmp_path):
    folder = _touch(str(tmp_path / "day[1]" / "a.parquet"))
    file = _touch(str(tmp_path / "b[x]*.parquet"))
    assert expand_input_path(f"{tmp_path}/day[1],{file}") == [folder, file]


@pytest.mark.parametrize("entry", ["missing.parquet", "nothing-*.parquet", "", " , "],
                         ids=["missing-file", "unmatched-glob", "empty", "only-commas"])
def test_paths_that_name_nothing_raise(tmp_path, entry):
    path = str(tmp_path / entry) if entry.strip(" ,") else entry
    with pytest.raises(DataError):
        expand_input_path(path)


def test_empty_directory_raises(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="empty directories"):
        expand_input_path(str(tmp_path / "empty"))


@pytest.mark.parametrize("entry", ["odps://project/tables/users", "hdfs://nn/data/*.parquet"])
def test_remote_tables_and_stores_are_refused_by_name(tmp_path, entry):
    (tmp_path / "a.parquet").write_bytes(b"")
    with pytest.raises(DataError, match=rf"input path '{entry.replace('*', '.')}': "
                                        rf"{entry.split(':')[0]}:// paths are not read"):
        expand_input_path(f"{tmp_path / 'a.parquet'},{entry}")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
@pytest.mark.parametrize("named", [False, True], ids=["in-directory", "named"])
def test_a_named_pipe_is_refused_naming_it(tmp_path, named):
    # reading one hung: a CSV file's rows are counted when listed, then read again
    _touch(str(tmp_path / "d" / "a.csv"))
    pipe = str(tmp_path / "d" / "b.csv")
    os.mkfifo(pipe)
    with pytest.raises(DataError, match=r"b\.csv is not a regular file"):
        expand_input_path(pipe if named else str(tmp_path / "d"))
