import importlib

import hashrec


def test_import_has_no_side_effects():
    mod = importlib.reload(hashrec)
    assert mod.__version__
