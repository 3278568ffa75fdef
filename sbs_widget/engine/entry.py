"""The lockstep engine: run the FX program and the ONNX model side by side and yield one ``Record``
per aligned pair as soon as both sides have produced it.

Design:
- the FX side is the decomposed program, run node by node (``fx_runner``);
- the ONNX side runs segment by segment (``segments``): one session per segment, created once and
  cached on the ``Prepared`` object, so reruns (reset experiments) pay nothing again;
- each value is freed once compared and no longer read on its side;
- the ONNX side always runs with the ONNX file's own weights.

Modules: ``prepared`` holds what is worked out once per pair (alignment, sizes, caches), ``lockstep``
one run over it, ``background`` the thread that compiles the coming segments; this module the entry
points (``prepare``, ``run_aligned``) and the check that tells which program the ONNX model comes from.

>>> import torch, sbs_widget
>>> model, inputs = sbs_widget.dummy_llm()
>>> ep = torch.export.export(model, inputs)
>>> onx = torch.onnx.export(ep, inputs, dynamo=True).model_proto  # doctest: +SKIP
>>> records = list(sbs_widget.run_aligned(ep, onx, inputs))       # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import re
import warnings
from collections import OrderedDict
from typing import Iterable, Iterator

import onnx
import torch

from sbs_widget.align.pair import Pair, PairOptions
from sbs_widget.align.pairs import target_name
from sbs_widget.align.pipeline import build_pair
from sbs_widget.align.same_program import first_difference
from sbs_widget.align.signature import check_signature
from sbs_widget.engine.background import start_threads
from sbs_widget.engine.cancel import Cancel, check_time_limit
from sbs_widget.engine.fx_runner import check_inputs, flat_inputs, on_inputs_device
from sbs_widget.engine.lockstep import LockstepRun
from sbs_widget.engine.prepared import SEGMENT_NODES, PreparedPair
from sbs_widget.engine.run_parts import Progress, RunOptions
from sbs_widget.engine.runtimes import Runtime, get_runtime
from sbs_widget.engine.second_model import SecondModel
from sbs_widget.engine.tolerance import DEFAULT_ATOL, DEFAULT_RTOL
from sbs_widget.engine.user_metrics import resolve_metrics
from sbs_widget.errors import InputError, ModelMismatchError, ProgramMismatchWarning, SbsWidgetWarning
from sbs_widget.load.export import Exported, export_module
from sbs_widget.load.onnx_checks import check_input_shapes
from sbs_widget.load.onnx_index import OnnxIndex
from sbs_widget.load.readers import (
    decompose_as_exporter,
    is_onnx_program,
    load_exported_program,
    load_inputs,
    load_onnx,
)
from sbs_widget.load.size_sources import follow_exporter_sizes
from sbs_widget.records import Record

__all__ = ["DEFAULT_ATOL", "DEFAULT_RTOL", "Prepared", "Progress", "prepare", "run_aligned"]

PARALLEL_VALUE_BYTES = 2 << 20  # onnxruntime runs a model with values this big on every core


class Prepared(PreparedPair):
    """A program and an ONNX model made ready for comparison (``prepare``): the aligned ``pair``, its
    ``schedule`` and its ``cache``. Build it once, ``run`` it many times."""

    def run(self, args=(), kwargs=None, *, runtime: str | Runtime = "onnxruntime",
            atol: float | None = None, rtol: float | None = None, reset_names: Iterable[str] = (),
            node_local: bool = False, exc: bool = False, progress: Progress | None = None,
            histogram: bool = True, segment_nodes: int = SEGMENT_NODES,
            keep_sessions: bool = True, time_limit: float | None = None,
            cancel: Cancel | None = None, reference: bool = True, keep_cuts: int | None = None,
            metrics=None, second: SecondModel | None = None) -> Iterator[Record]:
        """Yield records in execution order; see ``run_aligned`` for the options.

        ``keep_sessions``: keep the compiled segments for the next run (reset experiments then pay no
        compilation). ``False`` builds them one segment ahead and drops each once its segment is done:
        an onnxruntime session holds ~5 KB per node, which on a large graph with small weights is more
        than the model itself.
        ``cancel``: a token another thread may fire to stop the run; ``time_limit`` is armed on it.
        ``keep_cuts``: bytes kept at cuts for a rerun to restart from (``restart.py``; None: default).
        ``metrics``: figures measured beside the verdict (``user_metrics.py``), in ``Record.metrics``.
        ``second``: a second ONNX model's values measured against the same torch values, in the records'
        ``b_*`` fields (``second_model.py``; ``sbs_widget.compare_models`` builds it)."""
        for f in self.weight_files:  # (weights read from their file as needed: it must be the one loaded)
            f.check_unchanged()
        if cancel is None:
            cancel = Cancel(time_limit)
        elif time_limit is not None:
            cancel.time_limit = check_time_limit(time_limit)
        options = RunOptions(self.tolerance(atol, rtol), frozenset(self.resolve_names(reset_names).values()),
                             node_local, exc, progress, histogram, reference, segment_nodes, keep_sessions,
                             keep_cuts, resolve_metrics(metrics), second)
        flat, device = self._inputs(args, kwargs)
        # onnxruntime's own threads pay off on big values only (per session, measured on two cores:
        # +5% time on a 16-layer LLaMA of hidden size 64, none at 256 (1 MB values), -9% at 1024)
        threads = 0 if max(self.schedule.node_bytes, default=0) >= PARALLEL_VALUE_BYTES else 1
        rt = get_runtime(runtime, cuda=device.type == "cuda", threads=threads)
        return LockstepRun(self, flat, rt, options, device, cancel).records()

    def _inputs(self, args, kwargs) -> tuple[list, torch.device]:
        """The run's inputs, read, flattened as the program's placeholders and checked against both
        programs; and the device they are on."""
        args, kwargs = load_inputs(args, kwargs)
        program, index = self.decomposed_ep, self.index
        flat = flat_inputs(program, args, kwargs)
        check_inputs(program, flat)
        flat, device = on_inputs_device(program, flat)
        tensor_inputs = self.alignment.tensor_inputs
        if len(index.inputs) != len(tensor_inputs):
            raise ModelMismatchError(
                f"the ONNX model has {len(index.inputs)} inputs {index.inputs} but the program "
                f"{len(tensor_inputs)} tensor inputs {tensor_inputs}: they do not come from the same export"
            )
        by_name = {n.name: v for n, v in zip((n for n in self.fx_nodes if n.op == "placeholder"), flat)}
        check_input_shapes(self.onnx_model, [(fx, x, by_name.get(fx)) for fx, x in zip(tensor_inputs, index.inputs)])
        return flat, device


_PRINTED_NAMES = re.compile(r"%([A-Za-z_][A-Za-z0-9_]*)")


NO_METADATA = (
    "the ONNX model carries no pkg.torch.onnx metadata (exported with dynamo=False, or stripped since): "
    "only inputs, weights, outputs and values of the same name and type pair up; export it with "
    "torch.onnx.export(ep, ..., dynamo=True) to compare node by node")

AGREEMENT_SAMPLE = 128  # FX nodes checked in full (target, input names): enough to tell two programs apart


def _metadata_agreement(program: torch.export.ExportedProgram, index: OnnxIndex) -> tuple[int, int]:
    """How many FX nodes named by the ONNX metadata (``pkg.torch.onnx.fx_node`` holds the node as
    ``format_node()`` prints it) exist in ``program`` so: same name, and, for an evenly spread sample
    of them, the same target and input nodes. (A program decomposed differently has other names all
    over the graph, and other targets or inputs where names coincide: checking every name, and a
    sample's targets and inputs, tells the same as comparing the whole printed text, for a fraction
    of the cost.)"""
    nodes = {n.name: n for n in program.graph.nodes if n.op == "call_function"}
    named = {}
    for i, fx in enumerate(index.node_fx):
        if fx:
            named[fx] = i
    items = [(fx, i) for fx, i in named.items() if fx in nodes]
    ok = len(items)
    for fx, i in items[::max(1, len(items) // AGREEMENT_SAMPLE)]:
        node = nodes[fx]
        printed = _PRINTED_NAMES.findall(index.node_meta(i, "pkg.torch.onnx.fx_node") or "")[1:]
        if (index.node_fx_target[i] or "").removeprefix("torch.ops.") not in _printed_targets(node.target) or \
                list(dict.fromkeys(printed)) != [n.name for n in node.all_input_nodes]:
            ok -= 1
    return ok, len(named)


def _printed_targets(target) -> tuple[str, ...]:
    """How ``format_node`` may print ``target`` (the metadata's text), less a ``torch.ops.`` prefix:
    an operator's name (``aten.add.Tensor``), or a Python function's qualified name (``operator.add``
    for the sizes' arithmetic, which ``str`` prints ``<built-in function add>``)."""
    names = [target_name(target)]
    if callable(target) and not isinstance(target, torch._ops.OpOverload):
        with contextlib.suppress(Exception):
            qualified = torch.fx.node._get_qualified_name(target)
            names += [qualified, re.sub(r"^_operator\.", "operator.", qualified)]
    return tuple(names)


# -- public entry points --------------------------------------------------------------------------

_PREPARED: "OrderedDict[tuple, tuple]" = OrderedDict()
_PREPARED_MAX = 4  # pairs kept: the latest ones, the ones a notebook reruns


def prepare(ep, onx=None) -> Prepared:
    """Load, decompose (as the exporter does) and align once; the result runs many times.

    ``ep``: an ExportedProgram (the one ``torch.export.export`` returns), a ``.pt2`` path, or the
    ``ONNXProgram`` returned by ``torch.onnx.export`` (then ``onx`` is optional), or what
    ``export_module`` returns (both programs: the user's is accounted for node by node).
    ``onx``: an ``onnx.ModelProto`` or a path (external data is loaded).
    The last few pairs are cached, keyed by content (a digest of the ONNX model's or the file's bytes, the
    program's code and the version counters of its weights), so that repeated calls on the same
    content cost a digest, and an edited model or file is prepared again; the cache holds the
    objects, so identities stay valid.
    """
    if isinstance(ep, torch.nn.Module):  # exporting needs the inputs: prepare has none
        raise InputError("prepare needs the programs: export the model first (sbs_widget.export_module(model, "
                         "args)), or give the model to run_aligned / culprits / SbsWidget.from_module with its "
                         "inputs")
    options = PairOptions.from_environment()
    key = _cache_key(ep, onx) + (options,)
    hit = _PREPARED.get(key)
    if hit is not None and not all(f.unchanged() for f in hit[1].weight_files):
        del _PREPARED[key]  # same bytes, but a file rewritten: its weights are mapped again
        hit = None
    if hit is not None:
        _PREPARED.move_to_end(key)
        return hit[1]
    start_threads()  # the runs to come need them
    if is_onnx_program(ep) or isinstance(ep, Exported):
        model, data = load_onnx(onx if onx is not None else ep.model_proto)
        prepared = Prepared(build_pair(ep.exported_program, model, ep.user_ep if isinstance(ep, Exported) else None,
                                       OnnxIndex.build(model, data), options))
    else:
        if onx is None:
            raise InputError("onx is required: pass the ONNX model (ModelProto or path) exported from ep")
        program = load_exported_program(ep)
        # From a path, the big initializers stay in the file (read through the index): held once.
        model, data = load_onnx(onx)
        index = OnnxIndex.build(model, data)
        # inputs, outputs, dtypes and fixed shapes: a model from another export is told before decomposing
        check_signature(program, model, index.inputs, index.outputs)
        ok, total = _metadata_agreement(program, index)
        if total and ok == total:
            decomposed, user = program, None  # already the program the exporter translated
        else:
            decomposed, user = decompose_as_exporter(program), program
            ok2, total2 = _metadata_agreement(decomposed, index)
            if total2 and ok2 < total2 and follow_exporter_sizes(decomposed, index):
                # a program loaded from its file reads shared sizes from other inputs than the
                # exporter's did (size_sources): read where the exporter did, named as it named them
                ok2, total2 = _metadata_agreement(decomposed, index)
            if total2 and ok2 < 0.5 * total2:
                raise ModelMismatchError(
                    f"only {ok2} of the {total2} FX nodes named by the ONNX model's metadata exist in the "
                    "ExportedProgram (decomposed as the exporter does): the ONNX model was not exported "
                    "from this program"
                )
        prepared = Prepared(_with_notes(build_pair(decomposed, model, user, index, options), total))
    _PREPARED[key] = ((ep, onx), prepared)
    while len(_PREPARED) > _PREPARED_MAX:
        _PREPARED.popitem(last=False)
    return prepared


def _with_notes(pair: Pair, total: int) -> Pair:
    """``pair`` with what limits its comparison said once (and warned): the ONNX metadata naming another
    program's nodes, or no metadata at all (``total``: FX nodes the metadata names)."""
    # (an ONNXProgram carries the program it was exported from: nothing to check there)
    difference = first_difference(pair.decomposed_ep, pair.index) if total else None
    if difference is not None:
        message = difference.message()
        warnings.warn(message, ProgramMismatchWarning, stacklevel=3)
        return dataclasses.replace(pair, program_mismatch=message, notes=(message, *pair.notes))
    if not total and any(op != "Constant" for op in pair.index.op_types):
        warnings.warn(NO_METADATA, SbsWidgetWarning, stacklevel=3)
        return dataclasses.replace(pair, notes=(*pair.notes, NO_METADATA))
    return pair


def from_model(ep, onx, args, kwargs):
    """``(ep, onx)`` as given, or, for a ``torch.nn.Module``, both programs exported from it on the
    run's inputs (``load.export``: default options; ``export_module`` takes the others)."""
    if not isinstance(ep, torch.nn.Module):
        return ep, onx
    if onx is not None:
        raise InputError("a model is exported here: pass no ONNX model with it (or pass the ExportedProgram "
                         "and the ONNX model exported from it)")
    args, kwargs = load_inputs(args, kwargs)
    return export_module(ep, args, kwargs), None


def _cache_key(ep, onx) -> tuple:
    """What a preparation depends on, by content: a ModelProto edited in place, a file rewritten
    within its modification time, or a program whose weights changed in place is prepared again."""
    return (_content_key(ep), _content_key(onx) if onx is not None else None)


def _content_key(x) -> tuple:
    if isinstance(x, (str, os.PathLike)):
        path = os.fspath(x)
        return ("file", os.path.abspath(path), _file_digest(path))
    if isinstance(x, onnx.ModelProto):
        return ("onnx", id(x), _model_digest(x))
    if isinstance(x, torch.export.ExportedProgram):
        return ("program", id(x), _program_version(x))
    if is_onnx_program(x) or isinstance(x, Exported):
        return ("onnx_program", id(x), _program_version(x.exported_program), _model_digest(x.model_proto))
    return ("object", id(x))


def _file_digest(path: str) -> str | None:
    """The file's bytes hashed (BLAKE2, ~1 GB/s): cheaper than loading it again."""
    try:
        h = hashlib.blake2b()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        return h.hexdigest()
    except OSError:
        return None  # the loader says what is wrong with the path


def _model_digest(model: onnx.ModelProto) -> str:
    """The model's bytes hashed piece by piece (a whole model over 2 GB cannot be serialized at once)."""
    h = hashlib.blake2b()
    graph = model.graph
    for field in (graph.node, graph.initializer, graph.sparse_initializer, graph.input, graph.output,
                  graph.value_info, model.opset_import, model.functions, model.metadata_props):
        h.update(len(field).to_bytes(8, "little"))
        for item in field:
            h.update(item.SerializeToString())
    return h.hexdigest()


def _program_version(program: torch.export.ExportedProgram) -> tuple:
    """The graph's code and the in-place version counters of its weights and constants: a weight
    changed in place (``p.add_(1)``) or a graph edited bumps them (torch counts every in-place write)."""
    tensors = [*program.state_dict.items(), *program.constants.items()]
    return (hash(program.graph_module.code),
            tuple((k, v._version, v.data_ptr()) for k, v in tensors if isinstance(v, torch.Tensor)))


def run_aligned(ep, onx=None, args=(), kwargs=None, *, runtime: str | Runtime = "onnxruntime",
                atol: float | None = None, rtol: float | None = None, reset_names: Iterable[str] = (),
                node_local: bool = False, exc: bool = False, progress: Progress | None = None,
                time_limit: float | None = None, **options) -> Iterator[Record]:
    """Run ``ep`` and ``onx`` in lockstep and yield one ``Record`` per aligned pair, in execution order.

    - ``ep``/``onx``: see ``prepare``; or ``ep`` a ``torch.nn.Module`` and ``onx=None``: it is exported
      here (``export_module``, default options; a failure raises ``ExportError`` naming the stage).
      ``args``/``kwargs`` the model inputs, or ``args`` a path to a
      ``torch.save``d inputs file (read with ``weights_only=True``).
    - ``reset_names``: FX node names or ONNX value names whose torch value replaces the ONNX one for
      every downstream ONNX node ("if this value were right, would the rest be?").
    - ``node_local``: also run each ONNX node (or fused group) on torch inputs; fills ``err_local``.
    - ``atol``/``rtol``: a pair is beyond tolerance when some |diff| > atol + rtol * |torch|. ``None``:
      the default for the precision the program computes in (1e-4 for float32, 1e-3 for float16: see
      ``tolerance.py``; ``Prepared.tolerance()`` tells which).
    - ``exc``: raise ``ToleranceExceeded`` at the first pair beyond tolerance.
    - ``progress``: called with ``(done, total, current FX node name)``.
    - ``runtime``: ``"onnxruntime"`` (CUDA provider when inputs are on CUDA), ``"onnx.reference"`` or
      an object with ``.name`` and ``.compile(model)``.
    - ``time_limit``: seconds the run may take (from its first record); past it the run ends with
      ``RunTimeout`` naming the node it was at (an onnxruntime call in flight is terminated), the
      records yielded so far being the consumer's to keep.
    - ``metrics``: figures measured beside the verdict on every compared pair, in ``Record.metrics``
      (and the table's, the DataFrame's and the CLI's columns): names (``max_abs``, ``max_rel``,
      ``cosine``, ``sqnr_db``, ``nmse``, ``top1``, ``top5``...), callables ``f(torch, onnx) -> float``, or
      a dict name -> either (``engine/user_metrics.py``).
    - ``keep_sessions=False``: drop each compiled segment once done (see ``Prepared.run``): less
      memory, and reruns compile again.
    """
    ep, onx = from_model(ep, onx, args, kwargs)
    prepared = prepare(ep, onx)
    return prepared.run(args, kwargs, runtime=runtime, atol=atol, rtol=rtol, reset_names=reset_names,
                        node_local=node_local, exc=exc, progress=progress, time_limit=time_limit, **options)
