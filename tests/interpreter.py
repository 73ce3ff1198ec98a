"""Faster device-function calls under Triton's interpreter (TRITON_INTERPRET=1), for the tests
that run the kernels on CPU.

The interpreter re-patches the language modules (`inspect.getmembers` over `triton.language`
and its tensor and math namespaces, ~1.5 ms) on every call of a `@triton.jit` helper from a
kernel, though the kernel's launch already patched them and restores them when it ends; a
kernel test spends about 40 % of its time there. `speed_up_device_calls()` makes a helper call
skip that when every language module the helper sees was already patched in the running launch
(by the launch itself, or by an earlier helper call: Triton's own helpers see
`triton.language.core`, which a helper call patches and nothing restores), and patch as before
otherwise. Results are unchanged: the skipped patching would find nothing left to patch. A
Triton without these internals is left as it is.
"""
from __future__ import annotations

import inspect

_installed = False


def speed_up_device_calls() -> bool:
    """Install the skip once per process; False when this Triton's interpreter differs."""
    global _installed
    if _installed:
        return True
    try:
        import triton.language as tl
        from triton.runtime import interpreter as interp
        grid_call, fn_call = interp.GridExecutor.__call__, interp.InterpretedFunction.__call__
        error = interp.InterpreterError
    except (ImportError, AttributeError):
        return False
    langs_of: dict = {}
    active: list = []       # the language modules the running launches patched

    def langs(fn) -> frozenset:
        got = langs_of.get(fn)
        if got is None:
            got = langs_of[fn] = frozenset(id(v) for v in fn.__globals__.values()
                                           if inspect.ismodule(v) and v in (tl, tl.core))
        return got

    def launch(self, *args, **kwargs):
        active.append(set(langs(self.fn)))
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            active.pop()

    def device_call(self, *args, **kwargs):
        if not active or not langs(self.fn) <= active[-1]:
            if active:      # patched from here on in this launch (such patches are never undone)
                active[-1] |= langs(self.fn)
            return fn_call(self, *args, **kwargs)
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise error(repr(e)) from e

    interp.GridExecutor.__call__ = launch
    interp.InterpretedFunction.__call__ = device_call
    _installed = True
    return True
