"""A program and an ONNX model made ready for comparison, once: the decomposed program, the ONNX
index, the alignment, size estimates for cutting segments, and caches every run reads (compiled
segments, record fields, call plans, the ONNX weights)."""

from __future__ import annotations

import difflib
import functools
from concurrent.futures import Future
from typing import Callable, Iterable, Iterator

import numpy as np
import onnx
import torch

from sbs_widget import records as R
from sbs_widget.align.inner_pairs import InnerPlan, build_inner_plan, inner_fields
from sbs_widget.align.pairs import Alignment, align
from sbs_widget.dtypes import onnx_value_bytes
from sbs_widget.engine.background import background
from sbs_widget.engine.cancel import Cancel, check_time_limit
from sbs_widget.engine.fx_runner import (
    check_inputs,
    dead_nodes,
    flat_inputs,
    last_uses,
    on_inputs_device,
    program_outputs,
    small_nodes,
)
from sbs_widget.engine.lockstep import LockstepRun
from sbs_widget.engine.node_local import LocalGroup, build_group
from sbs_widget.engine.run_plan import FX_ONE_SIDED, ReleasePlan, fx_after, release_plan
from sbs_widget.engine.runtimes import Runtime, get_runtime
from sbs_widget.engine.segments import Segment, describe_segment, plan_segments, weights_budget
from sbs_widget.engine.tolerance import least_precise, resolve
from sbs_widget.engine.user_metrics import resolve_metrics
from sbs_widget.engine.weights import Weights
from sbs_widget.errors import InputError, ModelMismatchError
from sbs_widget.load.mapped_weights import weight_files
from sbs_widget.load.onnx_checks import check_input_shapes
from sbs_widget.load.onnx_index import OnnxIndex
from sbs_widget.load.readers import load_inputs
from sbs_widget.records import Record, record_template, with_fields

SEGMENT_NODES = 400  # most ONNX nodes per segment
MIN_SEGMENT_BYTES = 1 << 20  # below this, more sessions cost more time than the memory they save
PARALLEL_VALUE_BYTES = 2 << 20  # onnxruntime runs a model with values this big on every core

Progress = Callable[[int, int, str], None]


class Prepared:
    """A program and an ONNX model made ready for comparison: decomposition, alignment, segment plan
    and compiled sessions. Build it once (``prepare``), ``run`` it many times."""

    def __init__(self, decomposed: torch.export.ExportedProgram, model: onnx.ModelProto,
                 user_ep: torch.export.ExportedProgram | None = None, index: OnnxIndex | None = None):
        self.decomposed_ep = decomposed
        self.user_ep = user_ep
        self.onnx_model = model
        self.index = index if index is not None else OnnxIndex.build(model)
        self.alignment: Alignment = align(decomposed, self.index, id(user_ep.graph) if user_ep else None)
        graph = decomposed.graph
        self.fx_nodes = list(graph.nodes)
        self.fx_position = {n.name: i for i, n in enumerate(self.fx_nodes)}
        self.fx_last_use = last_uses(graph)
        self.fx_sizes = [(info.elements, info.nbytes) for info in self.alignment.fx_nodes]
        self.small_fx_nodes = small_nodes(self.fx_nodes, self.fx_sizes)
        # FxRunner's call plans, built by the first run on each device: device -> position -> plan
        self.fx_plans: dict[torch.device, dict[int, tuple]] = {}
        # After node i runs: the values it read for the last time, and its own if nothing reads it.
        self.fx_frees: list[list[str]] = [[] for _ in self.fx_nodes]
        for name, i in self.fx_last_use.items():
            self.fx_frees[i].append(name)
        for i, node in enumerate(self.fx_nodes):
            if node.op == "call_function" and node.name not in self.fx_last_use:
                self.fx_frees[i].append(node.name)
        self.n_fx_nodes = sum(1 for n in self.fx_nodes if n.op == "call_function")
        self.n_onnx_nodes = len(self.index.nodes)
        n = len(self.index.nodes)
        self.last_reader: dict[str, int] = {}
        for v, readers in self.index.consumers.items():
            self.last_reader[v] = max(readers)
        for o in self.index.outputs:
            self.last_reader[o] = n
        self._groups: dict[str, LocalGroup | None] = {}
        # values inside translations paired with a finer torch reference: compared too (handed back)
        self.inner: InnerPlan = build_inner_plan(self)
        # (half precision: handing a value back would make onnxruntime round it to float16 where it keeps
        # float32 between nodes, and change what follows; inner_run.py recomputes those apart)
        self.half = any(getattr(d, "itemsize", 0) == 2 and d.is_floating_point for d in self.alignment.fx_dtypes)
        self.wanted = set(self.alignment.onnx_to_fx) | set(self.index.outputs) | {
            v for v, pair in self.inner.pairs.items() if pair.constant or not self.half}
        # FX values whose twin is a constant-folded initializer: compared right after they are computed
        self.fx_folded = {fx for fx, pair in self.alignment.pairs.items()
                          if pair.onnx_value not in self.index.producer and pair.onnx_value in self.index.initializers}
        self.folded_into = {src: names[0] for src, names in self.index.folded_into().items()}
        self.fx_names = [n.name for n in self.fx_nodes]
        self.fx_after = [fx_after(n, info, self.alignment, self.fx_folded)
                         for n, info in zip(self.fx_nodes, self.alignment.fx_nodes)]
        self.node_bytes, self.live_bytes = self._estimate_sizes()
        self.weight_bytes = sum(t.numel() * t.element_size() for t in decomposed.state_dict.values())
        self.weight_files = weight_files([*decomposed.state_dict.values(), *decomposed.constants.values()])
        self._segments: dict[tuple[int, int], Segment] = {}
        self._compiled: dict[tuple, Callable] = {}
        self._weights: dict[str, np.ndarray] | None = None
        self._record_fields: dict[tuple, tuple] = {}
        self._segment_records: dict[tuple[int, int], list[tuple]] = {}
        self._weight_records: list[tuple] | None = None
        self._plans: dict[tuple, list[tuple[int, int]]] = {}  # (cuts, most nodes) -> segment ranges
        self._release_plans: dict[tuple, ReleasePlan] = {}  # (segment ranges, node_local) -> plan
        self.notes: list[str] = []  # what limits this comparison, said once (e.g. no exporter metadata)
        # the ONNX model's metadata names another program's node (``align/same_program.py``): the message
        self.program_mismatch: str | None = None
        self._check_outputs()

    # -- one-time checks -------------------------------------------------------------------------
    def _check_outputs(self) -> None:
        fx_out = program_outputs(self.decomposed_ep)
        if len(fx_out) != len(self.index.outputs):
            raise ModelMismatchError(
                f"the ExportedProgram has {len(fx_out)} outputs and the ONNX model {len(self.index.outputs)} "
                f"({self.index.outputs[:5]}): they do not come from the same model; export the ONNX "
                "model from this program (torch.onnx.export(ep, ..., dynamo=True))"
            )

    def _estimate_sizes(self) -> tuple[list[int], int]:
        """Bytes handed back per ONNX node (its compared outputs), and the largest set of torch
        values alive at once in an eager run: the yardstick segments are cut by."""
        fx_bytes: dict[str, int] = {}
        alive, live, peak = {}, 0, 0
        for node, (_, size), frees in zip(self.fx_nodes, self.fx_sizes, self.fx_frees):
            name = node.name
            fx_bytes[name] = size
            if node.op == "call_function":
                alive[name] = size
                live += size
                peak = max(peak, live)
            for gone in frees:  # inputs read for the last time (an unread output stays counted)
                if gone != name and gone in alive:
                    live -= alive.pop(gone)
        per_node = []
        wanted, onnx_to_fx, types = self.wanted, self.alignment.onnx_to_fx, self.index.types
        for outputs in self.index.node_outputs:
            total = 0
            for o in outputs:
                if o in wanted:
                    fx = onnx_to_fx.get(o)
                    total += fx_bytes.get(fx, 0) if fx else onnx_value_bytes(types.get(o))
            per_node.append(total)
        return per_node, peak

    def plan(self, cuts: set[int], segment_nodes: int = SEGMENT_NODES) -> list[tuple[int, int]]:
        """Segments for a run: values handed back by one segment stay near the eager live set."""
        # Alive at once: about the eager live set, or half the weights' size when that is larger
        # (fewer sessions to build; weights are shared with torch, not copied, so this stays within
        # the memory of one model).
        key = (frozenset(cuts), segment_nodes)
        if key not in self._plans:
            budget = max(self.live_bytes, self.weight_bytes // 2, 4 * max(self.node_bytes, default=0),
                         MIN_SEGMENT_BYTES)
            self._plans[key] = plan_segments(len(self.index.nodes), cuts, self.node_bytes, budget, segment_nodes,
                                             weights_budget(self.index, bool(self.weight_files)))
        return list(self._plans[key])

    # -- cached pieces ---------------------------------------------------------------------------
    def segment(self, start: int, end: int, hidden: frozenset = frozenset(), weights_in: bool = False) -> Segment:
        """``hidden``: values not to hand back, ``weights_in``: every weight copied in (a deployed runtime:
        asking for a value keeps it from a fusion, a weight fed as input is no constant to fold)."""
        key = (start, end, hidden, weights_in) if hidden or weights_in else (start, end)
        if key not in self._segments:
            self._segments[key] = describe_segment(self.index, start, end, self.wanted - hidden, self.last_reader,
                                                   weights_in)
        return self._segments[key]

    @functools.cached_property
    def fx_dead(self) -> set[str]:
        """FX nodes no output depends on (they have no ONNX node: said in their records)."""
        return dead_nodes(self.decomposed_ep.graph)

    @functools.cached_property
    def unrecorded(self) -> list:
        """The value-producing nodes of the user's program no record of a run names, each with why
        (``align/user_program.py``): a run ends with a one-sided record for each."""
        from sbs_widget.align.user_program import unrecorded_nodes

        recorded = {n.name for n in self.fx_nodes if n.op == "placeholder"} | set(self.alignment.pairs) | \
            set(self.alignment.alias_of)
        recorded |= {name for name, what in zip(self.fx_names, self.fx_after) if what == FX_ONE_SIDED}
        recorded |= {info.origin for info in self.alignment.fx_nodes if info.origin is not None and
                     (info.name in recorded)}
        return unrecorded_nodes(self, recorded)

    def weights(self) -> Weights:
        """The ONNX file's initializers as numpy arrays, shared by every segment."""
        if self._weights is None:
            self._weights = Weights(self)
        return self._weights

    def release_plan(self, ranges: list[tuple[int, int]], node_local: bool, reference: bool = False) -> ReleasePlan:
        """When a run cut into ``ranges`` may release torch values (worked out once per cut)."""
        key = (tuple(ranges), node_local, reference)
        plan = self._release_plans.get(key)
        if plan is None:
            plan = self._release_plans[key] = release_plan(self, ranges, node_local, reference)
        return plan

    def reference_stop(self, value: str) -> frozenset[str]:
        """The FX values a float64 reference of ``value``'s twin starts from: those the ONNX group
        recomputing ``value`` reads from torch (its anchors), so both cover the same computation."""
        g = self.group(value)
        return frozenset(self.alignment.onnx_to_fx[a] for a in g.anchors) if g is not None else frozenset()

    def group(self, value: str) -> LocalGroup | None:
        if value not in self._groups:
            twins = set(self.alignment.onnx_to_fx)
            self._groups[value] = build_group(self.index, value, twins)
        return self._groups[value]

    def compiled(self, runtime: Runtime, key: tuple, build: Callable[[], onnx.ModelProto]):
        """A compiled piece of the model, cached per runtime instance (held here, so that its id
        cannot be reused by another object while the entry lives)."""
        full = (runtime.name, id(runtime)) + key
        hit = self._compiled.get(full)
        if hit is None:
            hit = (runtime, runtime.compile(build()))
            self._compiled[full] = hit
        if isinstance(hit[1], Future):
            try:
                return hit[1].result()
            except BaseException:
                self._compiled.pop(full, None)  # compiled again (and failing again) in the caller's thread
                raise
        return hit[1]

    def forget(self, runtime: Runtime, keys: Iterable[tuple]) -> None:
        """Drop compiled pieces (their memory goes with them)."""
        for key in keys:
            self._compiled.pop((runtime.name, id(runtime)) + key, None)

    def compile_ahead(self, runtime: Runtime, pieces: list[tuple[tuple, Callable[[], onnx.ModelProto]]]) -> None:
        """Compile pieces not compiled yet in a background thread, in order: onnxruntime builds a
        session without holding the GIL, so the coming segments compile while the FX side runs.
        The pieces are built here, first: building them holds the GIL (protobuf), and a thread
        holding it makes the other wait for whole switch intervals (5 ms) at each hand-over."""
        todo = []
        for key, build in pieces:
            full = (runtime.name, id(runtime)) + key
            if full not in self._compiled:
                todo.append((full, build()))
        for full, model in todo:
            self._compiled[full] = (runtime, background("sbs-compile").submit(runtime.compile, model))

    def segment_records(self, start: int, end: int) -> list[tuple]:
        """What the records of segment ``[start, end)`` are, worked out once: per ONNX value in node
        order, ``(value, FX twin or None, record fields, ((FX alias, its record fields), ...))``;
        values with neither a twin nor a reason to be reported (Constant nodes, model outputs) are
        left out."""
        key = (start, end)
        plan = self._segment_records.get(key)
        if plan is not None:
            return plan
        plan = []
        index, onnx_to_fx, pairs, aliases = self.index, self.alignment.onnx_to_fx, self.alignment.pairs, \
            self.alignment.aliases
        outputs = set(index.outputs)
        for i in range(start, end):
            # the constants an inner value reads (align/inner_pairs.py), recorded with their reader
            plan += [(x, None, inner_fields(self, x), ()) for x in self.inner.constants_of.get(i, ())]
            for o in index.node_outputs[i]:
                if not o:
                    continue
                fx_name = onnx_to_fx.get(o)
                if fx_name is None:
                    if o in self.inner.of:
                        plan.append((o, None, inner_fields(self, o), ()))
                    elif index.op_types[i] != "Constant" and o not in outputs:
                        plan.append((o, None, self.record_fields(None, o, R.KIND_NODE, ""), ()))
                    continue
                pair = pairs[fx_name]
                more = aliases.get(o)
                if more:
                    more = tuple((a, self.record_fields(a, o, R.KIND_NODE, "", self._alias_comment(a))) for a in more)
                plan.append((o, fx_name, self.record_fields(fx_name, o, pair.kind, pair.how), more or ()))
        self._segment_records[key] = plan
        return plan

    def _alias_comment(self, fx_name: str) -> str:
        source = self.alignment.duplicate_of.get(fx_name)
        if source is not None:
            return _DUPLICATE_COMMENT.format(source)
        return _RESHAPED_COMMENT if fx_name in self.alignment.reshaped else _ALIAS_COMMENT

    def weight_records(self) -> list[tuple[tuple, str, str | None, bool]]:
        """Per weight, worked out once: (record fields, FX placeholder, ONNX initializer to compare
        with or None when there is nothing to compare, whether it holds the parameter transposed)."""
        if self._weight_records is None:
            plan = []
            for w in self.alignment.weights:
                fields = with_fields(self.record_fields(w.placeholder, w.onnx_name or None, R.KIND_WEIGHT, ""),
                                     ep_target=w.key, onnx_op_type="initializer" if w.onnx_name else None)
                comparable, comment = w.comparable, w.comment
                if w.transposed and w.onnx_name in self.alignment.onnx_to_fx:  # the program's own transpose
                    comparable = False  # is compared with it already
                    comment = f"folded into {w.onnx_name} (compared where the program transforms it)"
                    fields = with_fields(fields, onnx_name=None, onnx_op_type=None)
                if comment:
                    fields = with_fields(fields, comment=comment)
                if not comparable:
                    fields = with_fields(fields, status=R.ONE_SIDED)
                plan.append((fields, w.placeholder, w.onnx_name if comparable else None, w.transposed))
            self._weight_records = plan
        return self._weight_records

    def record_fields(self, fx_name: str | None, onnx_name: str | None, kind: str, how: str,
                      comment: str | None = None) -> tuple:
        """The fields of a record known before anything runs (``records.record_template``): worked out
        once per pair, read by every run. ``comment``: instead of the one saying how the pair was
        matched."""
        key = (fx_name, onnx_name, kind, how, comment)
        fields = self._record_fields.get(key)
        if fields is not None:
            return fields
        index = self.index
        i = index.producer.get(onnx_name) if onnx_name is not None else None
        info = self.alignment.fx_nodes[self.fx_position[fx_name]] if fx_name is not None else None
        if i is not None:
            op, node_name, out = index.op_types[i], index.nodes[i].name, index.node_outputs[i].index(onnx_name)
            # the FX side's module path when it has one (the ONNX scopes are read only otherwise)
            module = info.module if info is not None and info.module else index.module_of_node(i)
        else:
            op = "initializer" if onnx_name in index.initializers else "input" if onnx_name in index.inputs else None
            node_name = out = None
            module = info.module if info is not None else ""
        onnx_shape = index.describe(onnx_name) if onnx_name is not None else None
        if comment is None:
            comment = self._alias_comment(fx_name) if how == "duplicate" else \
                _SHARED_COMMENT.format(self.alignment.shares_constant_of[fx_name]) if how == "shared" else \
                _MATCHED_BY.get(how, "")
        fields = record_template(
            onnx_id_node=i, onnx_name=onnx_name, onnx_op_type=op, onnx_id_output=out, onnx_shape_type=onnx_shape,
            comment=comment, status=R.OK, module=module, kind=kind, onnx_node_name=node_name)
        if info is not None:
            fields = with_fields(fields, ep_id_node=info.index, ep_name=fx_name, ep_target=info.target,
                                 ep_shape_type=info.shape_type, ep_origin=info.origin, stack_trace=info.stack_line)
        self._record_fields[key] = fields
        return fields

    # -- names -----------------------------------------------------------------------------------
    def resolve_names(self, names: Iterable[str]) -> dict[str, str]:
        """Map names given by a user (FX node names, ONNX value names, ``fx::finer`` names of inner values)
        to ONNX values."""
        out: dict[str, str] = {}
        if isinstance(names, str):  # one name, not its characters
            names = (names,)
        fx_to_onnx = {k: p.onnx_value for k, p in self.alignment.pairs.items()}
        fx_to_onnx.update({f"{p.fx}::{p.finer}": v for v, p in self.inner.pairs.items()})
        for name in names:
            if (name in self.alignment.onnx_to_fx or name in self.inner.pairs) and name in self.index.producer:
                out[name] = name
            elif name in fx_to_onnx and fx_to_onnx[name] in self.index.producer:
                out[name] = fx_to_onnx[name]
            elif fx_to_onnx.get(name, name) in self.index.initializers or name in self.index.inputs:
                value = fx_to_onnx.get(name, name)
                readers = [self.index.node_outputs[i][0] for i in self.index.consumers.get(value, [])
                           if self.index.node_outputs[i] and self.index.node_outputs[i][0] in self.alignment.onnx_to_fx]
                hint = f"; reset what reads it instead: {', '.join(readers[:5])}" if readers else ""
                kind = "a model input" if name in self.index.inputs else "an initializer (a weight or a constant " \
                    "the exporter folded)"
                raise InputError(f"cannot reset {name!r}: its ONNX value {value!r} is {kind}, not computed by a "
                                 f"node{hint}")
            else:
                known = dict.fromkeys(list(self.alignment.onnx_to_fx) + list(fx_to_onnx))  # (each name once)
                close = difflib.get_close_matches(name, known, n=3)
                hint = f"; did you mean {', '.join(close)}?" if close else ""
                raise InputError(
                    f"cannot reset {name!r}: it is neither an FX node nor an ONNX value computed by a node "
                    f"with a torch twin or a finer torch reference{hint}"
                )
        return out

    # -- tolerance -------------------------------------------------------------------------------
    @property
    def precision(self) -> torch.dtype | None:
        """The least precise floating type the program computes in (it sets the default tolerance)."""
        return least_precise(self.alignment.fx_dtypes)

    def tolerance(self, atol: float | None = None, rtol: float | None = None) -> tuple[float, float]:
        """``(atol, rtol)``, each given one as is, each ``None`` the default for the program's
        precision (``tolerance.py``: 1e-4 for float32, 1e-3 for float16)."""
        return resolve(atol, rtol, self.precision)

    # -- running ---------------------------------------------------------------------------------
    def run(self, args=(), kwargs=None, *, runtime: str | Runtime = "onnxruntime",
            atol: float | None = None, rtol: float | None = None, reset_names: Iterable[str] = (),
            node_local: bool = False, exc: bool = False, progress: Progress | None = None,
            histogram: bool = True, segment_nodes: int = SEGMENT_NODES,
            keep_sessions: bool = True, time_limit: float | None = None,
            cancel: Cancel | None = None, reference: bool = True, keep_cuts: int | None = None,
            metrics=None) -> Iterator[Record]:
        """Yield records in execution order; see ``run_aligned`` for the options.

        ``keep_sessions``: keep the compiled segments for the next run (reset experiments then pay no
        compilation). ``False`` builds them one segment ahead and drops each once its segment is done:
        an onnxruntime session holds ~5 KB per node, which on a large graph with small weights is more
        than the model itself.
        ``cancel``: a token another thread may fire to stop the run; ``time_limit`` is armed on it.
        ``keep_cuts``: bytes kept at cuts for a rerun to restart from (``restart.py``; None: default).
        ``metrics``: figures measured beside the verdict (``user_metrics.py``), in ``Record.metrics``."""
        figures = resolve_metrics(metrics)
        for f in self.weight_files:  # (weights read from their file as needed: it must be the one loaded)
            f.check_unchanged()
        if cancel is None:
            cancel = Cancel(time_limit)
        elif time_limit is not None:
            cancel.time_limit = check_time_limit(time_limit)
        atol, rtol = self.tolerance(atol, rtol)
        args, kwargs = load_inputs(args, kwargs)
        flat = flat_inputs(self.decomposed_ep, args, kwargs)
        check_inputs(self.decomposed_ep, flat)
        flat, device = on_inputs_device(self.decomposed_ep, flat)
        cuda = device.type == "cuda"
        tensor_inputs = self.alignment.tensor_inputs
        if len(self.index.inputs) != len(tensor_inputs):
            raise ModelMismatchError(
                f"the ONNX model has {len(self.index.inputs)} inputs {self.index.inputs} but the program "
                f"{len(tensor_inputs)} tensor inputs {tensor_inputs}: they do not come from the same export"
            )
        by_name = {n.name: v for n, v in zip((n for n in self.fx_nodes if n.op == "placeholder"), flat)}
        check_input_shapes(self.onnx_model, [(fx, x, by_name.get(fx))
                                             for fx, x in zip(tensor_inputs, self.index.inputs)])
        # onnxruntime's own threads pay off on big values only (per session, measured on two cores:
        # +5% time on a 16-layer LLaMA of hidden size 64, none at 256 (1 MB values), -9% at 1024)
        threads = 0 if max(self.node_bytes, default=0) >= PARALLEL_VALUE_BYTES else 1
        rt = get_runtime(runtime, cuda=cuda, threads=threads)
        reset = self.resolve_names(reset_names)
        return LockstepRun(self, flat, rt, atol, rtol, set(reset.values()), node_local, exc, progress,
                           histogram, segment_nodes, keep_sessions, device, cancel, reference, keep_cuts,
                           figures).records()


_ALIAS_COMMENT = "no-op removed by the ONNX optimizer: compared with its input's twin"
_RESHAPED_COMMENT = ("no ONNX value of its shape: the ONNX graph has it only reshaped (a reshape removed or "
                     "moved by the optimizer); compared with that value, reshaped")
_DUPLICATE_COMMENT = ("same op on the same inputs as FX node {!r}: the ONNX optimizer merged them "
                      "(common subexpression elimination); compared with that node's twin")
_SHARED_COMMENT = ("equal to the constant of FX node {!r}: the ONNX optimizer folded both and kept one "
                  "initializer; compared with it")
_MATCHED_BY = {**{how: f"matched by {how}" for how in ("metadata", "folded", "consumer")},
               "fused": "matched by name: an output of a node fused from several"}
