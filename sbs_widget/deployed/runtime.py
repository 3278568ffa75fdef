"""The lockstep itself run as deployed: each segment's onnxruntime session built with the user's level,
config entries, disabled transformers and providers, and the values that do not survive the deployed
optimizations said so instead of compared.

A value the deployed graph no longer computes (fused away: a Conv's output inside Conv+BatchNorm, a
MatMul's inside FusedMatMul) cannot be compared; asking for it as a segment output would keep it alive
and stop the very fusion that removes it. So the whole model is optimized once at the deployed setting
(``optimized_model_filepath``), the values as written that its graph still computes are the survivors,
and the engine asks its segments for survivors only: the others get a one-sided record naming the
deployed node that computes past them.

>>> import sbs_widget
>>> runtime = sbs_widget.DeployedRuntime({"level": "all"})
>>> # records = sbs_widget.run_aligned(ep, onx, inputs, runtime=runtime)

Process-wide settings (``session.set_denormal_as_zero``) take effect as onnxruntime applies them, once
per process: ``check_deployed`` runs each session in a process of its own and is the one to trust there.
"""

from __future__ import annotations

import os
import tempfile

import onnx

from sbs_widget.deployed.settings import INSERTED, deployment
from sbs_widget.engine.runtimes import OnnxruntimeRuntime


class DeployedRuntime(OnnxruntimeRuntime):
    """``run_aligned(..., runtime=DeployedRuntime(session_options, providers))``: ``session_options`` an
    ``onnxruntime.SessionOptions``, a dict ``{"level": "all", "config": {KEY: VALUE}, "disabled": [...]}``
    or None (onnxruntime's defaults: ORT_ENABLE_ALL); ``providers``: names (default CPU)."""

    name = "onnxruntime (as deployed)"
    # Weights copied into each segment as initializers, as in the deployed model: fusions fold
    # constants (ConvBNFusion), which a weight fed as an input is not. (More memory than a plain run.)
    weights_in_segments = True

    def __init__(self, session_options=None, providers=None, intra_op_num_threads: int = 1):
        self.setting = deployment(session_options, providers)
        super().__init__(list(self.setting.providers), intra_op_num_threads)
        self.disabled_optimizers = tuple(self.setting.disabled)

    def session_options(self):
        opts = super().session_options()
        opts.graph_optimization_level = getattr(self._ort.GraphOptimizationLevel, self.setting.level)
        for key, value in self.setting.config:
            opts.add_session_config_entry(key, value)
        for key, value in self.setting.attributes:
            if key == "execution_mode":
                value = getattr(self._ort.ExecutionMode, value)
            setattr(opts, key, value)
        return opts

    def vanished_values(self, model: onnx.ModelProto) -> dict[str, str]:
        """ONNX value as written -> why it is not compared: the deployed graph (the whole model optimized
        once at this setting) no longer computes it. Inputs and weights never vanish."""
        with tempfile.TemporaryDirectory(prefix="sbs_deployed_rt_") as folder:
            path = os.path.join(folder, "optimized.onnx")
            opts = self.session_options()
            opts.optimized_model_filepath = path
            opts.log_severity_level = 3
            self._ort.InferenceSession(model.SerializeToString(), opts, providers=self.providers,
                                       disabled_optimizers=list(self.disabled_optimizers))
            deployed = onnx.load(path, load_external_data=False)
        computed = {o[len(INSERTED):] if o.startswith(INSERTED) else o for n in deployed.graph.node for o in n.output}
        producer = {o: n for n in deployed.graph.node for o in n.output}
        readers: dict[str, list] = {}
        for n in model.graph.node:
            for i in n.input:
                readers.setdefault(i, []).append(n)
        vanished = {}
        for node in model.graph.node:
            for value in node.output:
                if value and value not in computed:
                    past = _next_survivor(value, readers, computed)
                    into = producer.get(past) or producer.get(INSERTED + past) if past else None
                    where = f" into {into.op_type} '{into.name}'" if into is not None else ""
                    vanished[value] = (f"not computed as deployed ({self.setting.describe()}): fused{where} by "
                                       "onnxruntime's optimizer, so it has no value to compare")
        return vanished


def _next_survivor(value: str, readers: dict[str, list], computed: set[str]) -> str | None:
    """The first value downstream of ``value`` (breadth first over the graph as written) that the
    deployed graph still computes: the fused node's output."""
    seen, todo = {value}, [value]
    while todo:
        nxt = []
        for v in todo:
            for n in readers.get(v, ()):
                for o in n.output:
                    if o in computed:
                        return o
                    if o not in seen:
                        seen.add(o)
                        nxt.append(o)
        todo = nxt
    return None
