"""One program and its ONNX export compared on many input sets: which pairs differ on some inputs only
(padding, long sequences, a shape the export did not see), how far each pair's error spreads, which nodes the
culprit finder names across the inputs.

Each input set goes through the lockstep (``Prepared.run``). By default the runs go to worker processes on
this machine (a ``ProcessPoolExecutor``, spawn start method): each worker prepares the pair once (the program
and the ONNX model are passed as files: the user's paths, or files written into a temporary folder this call
removes after) and runs one input set per task; ``executor=`` takes any ``concurrent.futures.Executor``
(``dask.distributed``'s ``Client.get_executor()``: a remote cluster needs the models as paths it can read),
``max_workers=0`` runs in this process. At most ``2 * workers`` tasks are in flight: memory is bounded by
the pool, whatever the number of input sets (a generator or a DataLoader is read as tasks are submitted).
The aggregation is ``input_spread.py``.

>>> # sets = compare_input_sets(ep, onx, [(short,), (long,)], max_workers=0)
>>> # sets.input_dependent[0].onnx_name, sets.to_dataframe()
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import shutil
import tempfile
import time
from typing import Iterable, Iterator

import torch

from sbs_widget.errors import InputError
from sbs_widget.steps.input_spread import InputOutcome, InputSets, build_input_sets
from sbs_widget.strings import string_type

__all__ = ["InputSets", "compare_input_sets", "dump_calls", "normalize_input_set", "run_input_set"]

MAX_DEFAULT_WORKERS = 4
LABEL_CHARS = 80


def compare_input_sets(ep, onx=None, input_sets=(), *, executor: cf.Executor | None = None,
                       max_workers: int | None = None, atol: float | None = None, rtol: float | None = None,
                       node_local: bool = False, culprits: bool = True, dump_module: str | None = None,
                       progress=None, labels: list[str] | None = None, **run_options) -> InputSets:
    """Compare ``ep`` and ``onx`` (anything ``prepare`` takes: paths, an ExportedProgram and a ModelProto, an
    ONNXProgram) on every input set; see ``InputSets`` for the answer.

    ``input_sets``: a list (or any iterable) whose items are ``(args, kwargs)`` pairs, dicts of keyword inputs,
    tuples of args, single tensors or paths to ``torch.save``d inputs files; a ``torch.utils.data.DataLoader``
    (each batch one input set); or the path of a ``steal_forward`` dump: each call of its top module (the
    first module called, or ``dump_module``) is one input set.
    ``executor``: any ``concurrent.futures.Executor`` (its workers must import sbs_widget and read the model
    files); ``max_workers``: the pool made otherwise (default min(CPUs, number of sets, 4); 0: no pool, run
    here). ``atol``/``rtol``/``node_local`` and ``run_options`` (``runtime``, ``reset_names``, ``metrics``...:
    picklable) go to ``Prepared.run``; ``culprits``: run the culprit finder on each input (in the worker).
    ``progress(done, total)``: called as inputs complete (total None for an iterable of unknown length).
    ``labels``: what the inputs are called (default: their shapes, or the dump's call names).
    A failure on one input is recorded for that input (``InputSets.errors``); the others go on."""
    sets, read_labels, total = _input_sets(input_sets, dump_module)
    labels = _given_labels(labels, read_labels, total)
    options = dict(run_options, atol=atol, rtol=rtol, node_local=node_local, culprits=culprits)
    if executor is None and max_workers == 0:
        outcomes = _run_here(ep, onx, sets, labels, options, progress, total)
        return build_input_sets(outcomes, labels)
    if max_workers is not None and max_workers < 0:
        raise InputError(f"max_workers={max_workers}: give a count of processes, 0 to run in this process")
    folder = tempfile.mkdtemp(prefix="sbs_input_sets_")
    own = None
    try:
        ep_ref, onx_ref = model_files(ep, onx, folder)
        if executor is None:
            workers = max_workers or min(os.cpu_count() or 1, total or MAX_DEFAULT_WORKERS, MAX_DEFAULT_WORKERS)
            own = executor = _process_pool(max(1, workers))
            ahead = 2 * max(1, workers)
        else:
            ahead = 2 * max(1, max_workers or _executor_workers(executor))
        outcomes = _run_on(executor, ep_ref, onx_ref, sets, labels, options, ahead, progress, total)
    finally:
        if own is not None:
            own.shutdown(wait=True, cancel_futures=True)
        shutil.rmtree(folder, ignore_errors=True)
    return build_input_sets(outcomes, labels)


# -- the input sets ---------------------------------------------------------------------------------------


def _input_sets(input_sets, dump_module: str | None) -> tuple[Iterator[tuple], list[str], int | None]:
    """``(iterator of (args, kwargs), labels filled as it is read, number of sets or None)``."""
    if isinstance(input_sets, (str, os.PathLike)):
        from sbs_widget.dumps.steal import load_dump

        calls = dump_calls(load_dump(input_sets), dump_module)
        labels: list[str] = []
        return _labelled(((a, k, label) for label, (a, k) in calls), labels), labels, len(calls)
    try:
        total = len(input_sets)
    except TypeError:
        total = None
    labels = []
    return _labelled(((*normalize_input_set(item), None) for item in input_sets), labels), labels, total


def _given_labels(given: list[str] | None, read: list[str], total: int | None) -> list[str]:
    """The user's labels, checked against the number of sets; else those read with the sets."""
    if given is None:
        return read
    if total is not None and len(given) != total:
        raise InputError(f"labels: {len(given)} given for {total} input sets; give one per set")
    return [str(label) for label in given]


def _labelled(items: Iterable[tuple], labels: list[str]) -> Iterator[tuple]:
    for args, kwargs, label in items:
        labels.append(label or _label(args, kwargs))
        yield args, kwargs


def _label(args, kwargs) -> str:
    if isinstance(args, (str, os.PathLike)):
        return os.path.basename(os.fspath(args))
    text = string_type((tuple(args), kwargs or {}))
    return text if len(text) <= LABEL_CHARS else text[:LABEL_CHARS - 3] + "..."


def normalize_input_set(item) -> tuple:
    """``(args, kwargs)`` of one input set: an ``(args, kwargs)`` pair, a dict of keyword inputs (a
    tokenizer's output, a DataLoader's dict batch), a tuple or list of args, a tensor, or a path to an inputs
    file (``(path, None)``: read where it runs, by ``load_inputs``)."""
    if isinstance(item, (str, os.PathLike)):
        return os.path.abspath(os.fspath(item)), None
    if isinstance(item, torch.Tensor):
        return (item,), {}
    if isinstance(item, dict) or hasattr(item, "keys") and hasattr(item, "__getitem__"):
        return (), dict(item)
    if isinstance(item, (tuple, list)):
        if len(item) == 2 and isinstance(item[0], (tuple, list)) and isinstance(item[1], dict):
            return tuple(item[0]), dict(item[1])
        return tuple(item), {}
    raise InputError(f"an input set is (args, kwargs), a dict of keyword inputs, a tuple of args, a tensor or a "
                     f"path; got {type(item).__name__}")


def dump_calls(dump: dict, module: str | None = None) -> list[tuple[str, tuple]]:
    """``[(label, (args, kwargs))]``: the calls of ``module`` in a ``load_dump``ed dump, in call order;
    ``module`` None: the module called first (the top module, when the whole model was stolen)."""
    names = [key[0] for key in dump if key[2] == "I"]
    if not names:
        raise InputError("the dump holds no call's inputs")
    module = names[0] if module is None else module
    calls = [(f"{name}[{it}]", dump[name, it, kind]) for name, it, kind in dump if kind == "I" and name == module]
    if not calls:
        raise InputError(f"the dump holds no call of {module!r}; its modules: {sorted(set(names))}")
    return [(label, (tuple(a), dict(k))) for label, (a, k) in calls]


# -- the models as files --------------------------------------------------------------------------------


def model_files(ep, onx, folder: str) -> tuple[str, str]:
    """Paths a worker prepares the pair from: the user's paths as given, anything else saved into
    ``folder`` (``torch.export.save``, ``onnx.save``; a model too big for one protobuf with external data)."""
    from sbs_widget.load.export import Exported
    from sbs_widget.load.readers import is_onnx_program

    if isinstance(ep, Exported):  # the user's program: the worker decomposes it as the exporter did
        ep, onx = ep.user_ep, onx if onx is not None else ep.onnx_program
    elif is_onnx_program(ep):
        ep, onx = ep.exported_program, onx if onx is not None else ep
    if onx is None:
        raise InputError("onx is required: pass the ONNX model (ModelProto or path) exported from ep")
    if isinstance(ep, (str, os.PathLike)):
        ep_path = os.path.abspath(os.fspath(ep))
    elif isinstance(ep, torch.export.ExportedProgram):
        ep_path = os.path.join(folder, "program.pt2")
        torch.export.save(ep, ep_path)
    else:
        raise InputError(f"ep: an ExportedProgram, an ONNXProgram or a .pt2 path, not {type(ep).__name__}")
    if isinstance(onx, (str, os.PathLike)):
        return ep_path, os.path.abspath(os.fspath(onx))
    onx_path = os.path.join(folder, "model.onnx")
    if is_onnx_program(onx) or isinstance(onx, Exported):
        (onx.onnx_program if isinstance(onx, Exported) else onx).save(onx_path)
    else:
        _save_onnx(onx, onx_path)
    return ep_path, onx_path


def _save_onnx(model, path: str) -> None:
    import onnx

    if not isinstance(model, onnx.ModelProto):
        raise InputError(f"onx: an onnx.ModelProto, an ONNXProgram or a path, not {type(model).__name__}")
    try:
        if model.ByteSize() < 2**31 - 2**20:
            onnx.save(model, path)
            return
    except ValueError:
        pass
    copy = onnx.ModelProto()  # onnx.save moves the tensors out of the proto it writes: the user's stays whole
    copy.CopyFrom(model)
    onnx.save(copy, path, save_as_external_data=True, location=os.path.basename(path) + ".data")


# -- the runs -------------------------------------------------------------------------------------------


def run_input_set(ep_ref, onx_ref, index: int, args, kwargs, options: dict) -> InputOutcome:
    """The task a worker runs: prepare the pair (cached per process by ``prepare``) and run one input set."""
    from sbs_widget.engine.entry import prepare

    begin = time.perf_counter()
    try:
        prepared = prepare(ep_ref, onx_ref)
    except Exception as e:  # every input says so: the parent keeps going
        return InputOutcome(index, error=_error_text(e), seconds=time.perf_counter() - begin)
    return _run_prepared(prepared, index, args, kwargs, options)


def _run_prepared(prepared, index: int, args, kwargs, options: dict) -> InputOutcome:
    from sbs_widget.blame.culprits import find_culprits

    options = dict(options)
    atol, rtol = prepared.tolerance(options.pop("atol"), options.pop("rtol"))
    want_culprits = options.pop("culprits")
    out = InputOutcome(index, atol=atol, rtol=rtol)
    begin = time.perf_counter()
    try:
        for rec in prepared.run(args, kwargs, atol=atol, rtol=rtol, **options):
            out.records.append(rec)
        if want_culprits:
            out.culprits = list(find_culprits(out.records, prepared=prepared, atol=atol, rtol=rtol))
    except Exception as e:  # the records so far are kept with the error
        out.error = _error_text(e)
    out.seconds = time.perf_counter() - begin
    return out


def _error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def _run_here(ep, onx, sets, labels, options, progress, total) -> list[InputOutcome]:
    from sbs_widget.engine.entry import prepare

    try:
        prepared, failure = prepare(ep, onx), None
    except Exception as e:
        prepared, failure = None, _error_text(e)
    outcomes = []
    for index, (args, kwargs) in enumerate(sets):
        outcomes.append(InputOutcome(index, error=failure) if prepared is None
                        else _run_prepared(prepared, index, args, kwargs, options))
        if progress is not None:
            progress(index + 1, total)
    return outcomes


def _run_on(executor, ep_ref, onx_ref, sets, labels, options, ahead: int, progress, total) -> list[InputOutcome]:
    """Submit the sets, at most ``ahead`` in flight; an input whose task failed (a worker died, an input that
    does not pickle) gets an outcome with the error."""
    pending: dict[cf.Future, int] = {}
    outcomes: list[InputOutcome] = []
    sets = enumerate(sets)
    exhausted = False
    while pending or not exhausted:
        while not exhausted and len(pending) < ahead:
            item = next(sets, None)
            if item is None:
                exhausted = True
                break
            index, (args, kwargs) = item
            try:
                pending[executor.submit(run_input_set, ep_ref, onx_ref, index, args, kwargs, options)] = index
            except Exception as e:  # a broken pool, an input that cannot be sent
                outcomes.append(InputOutcome(index, error=_error_text(e)))
        if not pending:
            continue
        done, _ = cf.wait(list(pending), return_when=cf.FIRST_COMPLETED)
        for future in done:
            index = pending.pop(future)
            try:
                outcomes.append(future.result())
            except Exception as e:
                outcomes.append(InputOutcome(index, error=_error_text(e)))
            if progress is not None:
                progress(len(outcomes), total)
    return outcomes


def _init_worker(threads: int) -> None:
    torch.set_num_threads(threads)


def _process_pool(workers: int) -> cf.ProcessPoolExecutor:
    """Spawned processes (a fork of a process running torch's threads may hang), sharing the cores."""
    threads = max(1, (os.cpu_count() or 1) // workers)
    return cf.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                  initializer=_init_worker, initargs=(threads,))


def _executor_workers(executor) -> int:
    """How many tasks the executor runs at once, as far as it tells (a pool's ``_max_workers``, a dask
    client's threads), else the CPUs here."""
    n = getattr(executor, "_max_workers", None)
    if isinstance(n, int) and n > 0:
        return n
    client = getattr(executor, "_client", None)
    try:
        return max(1, sum(client.nthreads().values()))
    except Exception:
        return os.cpu_count() or 1
