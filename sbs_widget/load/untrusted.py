"""Reading files that may come from anyone: ``.pt2`` programs and inputs files.

Unpickling runs code, so every pickle is read with ``torch.load(weights_only=True)``: data only.
``torch.export.load`` itself falls back to ``weights_only=False`` for the pickles inside a ``.pt2``
(sample inputs, weights, constants), so a crafted file runs its code on loading; here it loads with
``torch.load`` forced to ``weights_only=True`` instead.

Container types: an LLM exported with its KV cache takes a ``DynamicCache`` (or another ``Cache``) as
input. Loading such a ``.pt2`` needs the type registered with ``torch.utils._pytree`` (transformers
registers its caches under the name ``module:Class``), and unpickling one needs the type allowed by
``weights_only``. Both are done for transformers' cache types only, and only when a load names one;
any other type gets an error that says what to register.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import re
import threading

import torch

from sbs_widget.load.mapped_weights import mapped_records

_UNREGISTERED = re.compile(r"Deserializing (\S+) in pytree is not registered")
_UNSAFE_GLOBAL = re.compile(r"GLOBAL (transformers\.cache_utils\.\w+) was not an allowed global")
_REFUSED = re.compile(r"(?:Unsupported global: GLOBAL|unsupported GLOBAL) ([\w.]+)")
# where transformers defines the types its exports carry (caches, ModelOutputs)
_TRANSFORMERS_MODULES = re.compile(r"transformers\.(cache_utils|modeling_outputs|models\.\w+\.modeling_\w+)")
_TORCH_LOAD = torch.load  # the real one, whoever patches torch.load later


def unregistered_type(error_text: str) -> str | None:
    """The serialized name of the pytree type a failed ``torch.export.load`` could not rebuild."""
    m = _UNREGISTERED.search(error_text)
    return m.group(1) if m else None


def refused_global(error_text: str) -> str | None:
    """The class or function a data-only unpickling refused, named as torch's message names it."""
    m = _REFUSED.search(error_text)
    return m.group(1) if m else None


def register_transformers_type(serialized_name: str) -> bool:
    """Register transformers' class ``serialized_name`` (``module:Class``) as a pytree node, the way
    transformers' own exporter does; False when it is not a transformers cache or model output (the
    only types an export's inputs and outputs hold), or cannot be."""
    module, _, qualname = serialized_name.partition(":")
    if not _TRANSFORMERS_MODULES.fullmatch(module) or not qualname.isidentifier():
        return False  # the name comes from the file: import nothing else
    try:
        cls = getattr(importlib.import_module(module), qualname)
        from transformers.cache_utils import Cache
        from transformers.exporters.exporter_dynamo import register_pytree_node
        from transformers.utils import ModelOutput
    except (ImportError, AttributeError):
        return False
    if not (isinstance(cls, type) and issubclass(cls, (Cache, ModelOutput))):
        return False  # a model class, say: registering it would change pytree for the whole process
    register_pytree_node(cls)
    return True


def load_capturing_errors(load, *args, **kwargs):
    """``load(*args, **kwargs)``, with the errors torch.export only logs (and then replaces by "check
    the warnings above") collected instead of printed: returns ``(result or None, error texts)``."""
    logger = logging.getLogger("torch.export")
    texts: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            texts.append(record.getMessage())
            if record.exc_info and record.exc_info[1] is not None:
                texts.append(f"{type(record.exc_info[1]).__name__}: {record.exc_info[1]}")

    handler, propagate = Collect(), logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        try:
            return load(*args, **kwargs), texts
        except Exception as e:  # the caller words the error, with what was logged
            texts.append(f"{type(e).__name__}: {e}")
            return None, texts
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


def transformers_cache_globals(error_text: str) -> list[type] | None:
    """The classes to allow in ``torch.load(weights_only=True)`` when the refused global is one of
    transformers' cache types: the plain data classes of ``transformers.cache_utils`` (no custom
    unpickling hook, so loading them runs no code of theirs). None when another global was refused."""
    if not _UNSAFE_GLOBAL.search(error_text):
        return None
    try:
        cache_utils = importlib.import_module("transformers.cache_utils")
    except ImportError:
        return None
    hooks = ("__setstate__", "__reduce__", "__reduce_ex__", "__setattr__", "__new__")
    return [cls for _, cls in inspect.getmembers(cache_utils, inspect.isclass)
            if cls.__module__ == cache_utils.__name__
            and not any(h in vars(c) for c in cls.__mro__ if c.__module__.startswith("transformers") for h in hooks)]


def load_data(f, *args, **kwargs):
    """``torch.load(f, weights_only=True)``, allowing transformers' cache types when the file holds
    one; a file holding any other class is refused (``pickle.UnpicklingError`` naming it)."""
    kwargs["weights_only"] = True
    start = f.tell() if hasattr(f, "tell") else None
    try:
        return _TORCH_LOAD(f, *args, **kwargs)
    except Exception as e:
        allowed = transformers_cache_globals(str(e))
        if not allowed:
            raise
    if start is not None:
        f.seek(start)
    with torch.serialization.safe_globals(allowed):
        return _TORCH_LOAD(f, *args, **kwargs)


@contextlib.contextmanager
def _data_only_unpickling():
    """``torch.load`` reads data only while this is active, whatever its caller asks (torch's own
    ``.pt2`` reader asks for ``weights_only=False``)."""
    def load(f, *args, **kwargs):
        kwargs.pop("weights_only", None)
        return load_data(f, *args, **kwargs)

    torch.load = load
    try:
        yield
    finally:
        torch.load = _TORCH_LOAD


def _load_pt2(path: str):
    """What ``torch.export.load`` does for a current archive, without its fallback to the older
    layout (read by another code path, with Python's zip reader, which ``pt2_checks`` does not vet)."""
    from torch.export.pt2_archive._package import load_pt2

    programs = load_pt2(path).exported_programs
    if "model" not in programs:
        raise RuntimeError(f"the archive holds no program named 'model' (it holds {sorted(programs)})")
    return programs["model"]


def load_program(path: str):
    """The program of the ``.pt2`` at ``path``, unpickling data only: ``(program or None, error texts)``.
    One load at a time: a second thread's load ending first would otherwise restore ``torch.load``
    under this one."""
    with _ONE_LOAD, _data_only_unpickling(), mapped_records(path):  # a big file's weights: mapped
        return load_capturing_errors(_load_pt2, path)


_ONE_LOAD = threading.Lock()
