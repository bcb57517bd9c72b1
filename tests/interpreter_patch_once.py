"""Triton's interpreter patches ``triton.language`` once a kernel launch, not once a call.

Under ``TRITON_INTERPRET=1`` every launch patches the language modules its kernel sees
(``tl``, ``tl.core``) with interpreted builtins and restores them when its programs are
done. Every call of a ``@triton.jit`` helper inside a program patches them again,
although the launch's patch is still in place: the same attributes set to equivalent
values, never restored. That repeat is a third of an interpreted test's time (a program
per key, a dozen helper calls a program). ``install()`` keeps a helper call from
patching modules that the running launch has patched already; a helper whose modules the
launch does not cover is patched as before. Kernels compute exactly what they computed.
"""

from __future__ import annotations

import inspect

_covered: set[int] = set()  # ids of the language modules patched in the running launch
_langs_of: dict[object, frozenset[int]] = {}
_installed = False


def _langs(fn) -> frozenset[int]:
    """The language modules the interpreter patches for ``fn`` (its globals that are
    ``triton.language`` or ``triton.language.core``)."""
    langs = _langs_of.get(fn)
    if langs is None:
        import triton.language as tl
        langs = frozenset(id(v) for v in fn.__globals__.values()
                          if inspect.ismodule(v) and v in (tl, tl.core))
        _langs_of[fn] = langs
    return langs


def install() -> bool:
    """Installs the once-a-launch patching where this Triton has the interpreter it was
    written for (else leaves Triton alone); returns whether it is installed."""
    global _installed
    if _installed:
        return True
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    grid_executor = getattr(interpreter, "GridExecutor", None)
    function = getattr(interpreter, "InterpretedFunction", None)
    if not (grid_executor and function and hasattr(interpreter, "_patch_lang")
            and hasattr(function, "rewrite") and hasattr(interpreter, "InterpreterError")):
        return False
    launch = grid_executor.__call__

    def launch_covering(self, *args, **kwargs):
        before = set(_covered)
        _covered.update(_langs(self.fn))
        try:
            return launch(self, *args, **kwargs)
        finally:
            _covered.clear()
            _covered.update(before)

    def call(self, *args, **kwargs):
        langs = _langs(self.fn)
        if not langs <= _covered:
            interpreter._patch_lang(self.fn)
            _covered.update(langs)  # in place until the launch ends (never restored)
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - as the interpreter reports a helper's error
            raise interpreter.InterpreterError(repr(e)) from e

    grid_executor.__call__ = launch_covering
    function.__call__ = call
    _installed = True
    return True
