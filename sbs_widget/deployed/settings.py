"""What a deployment is made of (optimization level, session config entries, providers, other session
attributes), read from the user's ``SessionOptions`` or given plainly, and the names onnxruntime's
graph transformers go by (the ``disabled_optimizers`` argument of ``InferenceSession``)."""

from __future__ import annotations

import dataclasses

from sbs_widget.errors import InputError

# Levels in the order onnxruntime applies them; each includes the ones before.
LEVELS = ("ORT_DISABLE_ALL", "ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED", "ORT_ENABLE_LAYOUT", "ORT_ENABLE_ALL")
LEVEL_NAMES = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED",
               "layout": "ORT_ENABLE_LAYOUT", "all": "ORT_ENABLE_ALL"}
CPU = "CPUExecutionProvider"
# Providers that compute nothing themselves (Azure calls a remote endpoint): left out of comparisons.
NOT_COMPUTING = {"AzureExecutionProvider"}

# Transformer and rewrite-rule names of onnxruntime 1.2x-1.3x (graph_transformer_utils.cc and the
# strings of the installed library), by the first level that applies them. Names the build lacks
# are ignored by onnxruntime, so the list may be a superset.
TRANSFORMERS = {
    "ORT_ENABLE_BASIC": (
        "ConstantFolding", "CommonSubexpressionElimination", "ConstantSharing", "EliminateIdentity",
        "EliminateSlice", "EliminateDropout", "UnsqueezeElimination", "ExpandElimination", "CastElimination",
        "NoopElimination", "DivMulFusion", "FuseReluClip", "GemmTransposeFusion", "NotWhereFusion",
        "ConvAddFusion", "ConvMulFusion", "ConvBNFusion", "PadFusion", "MatmulBNFusion", "ReshapeFusion",
        "FreeDimensionOverrideTransformer", "QDQPropagationTransformer", "EnsureUniqueDQForNodeUnit",
        "RemoveDuplicateCastTransformer", "CastChainElimination", "MatMulAddFusion", "ConcatSliceElimination",
        "GemmSumFusion", "GemmActivationFusion", "DoubleQDQPairsRemover", "GatherToSliceFusion",
        "GatherSliceToSplitFusion", "SliceConcatToSpaceToDepthFusion", "LabelEncoderFusion",
        "PreShapeNodeElimination", "TransposeOptimizer", "LayerNormFusionL1", "GeluFusionL1"),
    "ORT_ENABLE_EXTENDED": (
        "GeluFusionL2", "LayerNormFusionL2", "SimplifiedLayerNormFusion", "AttentionFusion",
        "EmbedLayerNormFusion", "GroupQueryAttentionFusion", "GroupQueryAttentionPreNormFusion",
        "SkipLayerNormFusion", "BiasSkipLayerNormFusion", "FastGeluFusion", "QuickGeluFusion", "BiasGeluFusion",
        "GeluApproximation", "BiasSoftmaxFusion", "BiasDropoutFusion", "MatMulScaleFusion",
        "MatmulTransposeFusion", "MatMulActivationFusion", "MatMulIntegerToFloatFusion",
        "DynamicQuantizeMatMulFusion", "ConvActivationFusion", "ConvAddActivationFusion", "SwiGluFusion",
        "QDQSelectorActionTransformer", "QDQS8ToU8Transformer", "QDQFinalCleanupTransformer",
        "DQMatMulNBitsFusion", "MatMulNBitsMlpFusion", "MatMulNBitsQkvFusion", "MatMulNBitsQLoRAFusion",
        "Avx2WeightS8ToU8Transformer", "FuseFp16InitializerToFp32NodeTransformer", "GqaValueLayoutTransformer"),
    "ORT_ENABLE_LAYOUT": ("NhwcTransformer",),
    "ORT_ENABLE_ALL": ("NchwcTransformer",),
}
# The op types a fusion creates, for a fused node whose name does not carry its transformer.
CREATES = {
    "Gelu": ("GeluFusionL1", "GeluFusionL2"), "FastGelu": ("FastGeluFusion",), "BiasGelu": ("BiasGeluFusion",),
    "QuickGelu": ("QuickGeluFusion",), "LayerNormalization": ("LayerNormFusionL1", "LayerNormFusionL2"),
    "SimplifiedLayerNormalization": ("SimplifiedLayerNormFusion",),
    "SkipLayerNormalization": ("SkipLayerNormFusion", "BiasSkipLayerNormFusion"),
    "SkipSimplifiedLayerNormalization": ("SkipLayerNormFusion",), "Attention": ("AttentionFusion",),
    "MultiHeadAttention": ("AttentionFusion",), "GroupQueryAttention": ("GroupQueryAttentionFusion",),
    "EmbedLayerNormalization": ("EmbedLayerNormFusion",), "BiasSoftmax": ("BiasSoftmaxFusion",),
    "FusedMatMul": ("MatMulScaleFusion", "MatmulTransposeFusion"), "Gemm": ("MatMulAddFusion",),
    "FusedGemm": ("GemmActivationFusion",), "FusedConv": ("ConvActivationFusion", "ConvAddActivationFusion"),
    "NchwcConv": ("NchwcTransformer",), "ReorderInput": ("NchwcTransformer",),
    "ReorderOutput": ("NchwcTransformer",), "Split": ("GatherSliceToSplitFusion",),
}


@dataclasses.dataclass(frozen=True)
class Setting:
    """One way of running the whole model: what a worker session is built with."""

    level: str = "ORT_ENABLE_ALL"
    config: tuple[tuple[str, str], ...] = ()
    providers: tuple[str, ...] = (CPU,)
    disabled: tuple[str, ...] = ()
    attributes: tuple[tuple[str, object], ...] = ()  # intra_op_num_threads, execution_mode, ...

    def describe(self) -> str:
        parts = [self.level]
        parts += [f"{k}={v}" for k, v in self.config]
        if self.providers != (CPU,):
            parts.append("+".join(self.providers))
        if self.disabled:
            parts.append(f"disabled {len(self.disabled)} transformers")
        return ", ".join(parts)


AS_WRITTEN = Setting(level="ORT_DISABLE_ALL")

# Casts onnxruntime inserts around nodes its provider runs in another type: bookkeeping, not fusions.
INSERTED = "InsertedPrecisionFreeCast_"

# Session attributes copied from a user's SessionOptions (the rest do not change values).
_ATTRIBUTES = ("intra_op_num_threads", "inter_op_num_threads", "execution_mode", "use_deterministic_compute")
# Config entries probed on a SessionOptions: onnxruntime has no way to list the ones set.
KNOWN_CONFIG = (
    "session.set_denormal_as_zero", "session.disable_prepacking", "session.use_env_allocators",
    "session.disable_quant_qdq", "session.disable_double_qdq_remover", "session.enable_quant_qdq_cleanup",
    "session.disable_aot_function_inlining", "optimization.enable_gelu_approximation",
    "optimization.minimal_build_optimizations", "optimization.disable_specified_optimizers",
    "optimization.enable_cast_chain_elimination", "session.qdqisint8allowed", "session.x64quantprecision",
    "mlas.enable_gemm_fastmath_arm64_bfloat16", "session.intra_op.allow_spinning",
    "session.inter_op.allow_spinning", "session.dynamic_block_base", "session.force_spinning_stop",
    "session.strict_shape_type_inference", "session.allow_released_opsets_only",
    "session.node_partition_config_file", "session.intra_op_thread_affinities",
    "session.disable_cpu_ep_fallback", "session.use_ort_model_bytes_directly", "ep.context_enable",
    "session.disable_mem_pattern_for_dynamic_shape", "mlas.use_kleidiai",
)


def deployment(session_options=None, providers=None) -> Setting:
    """The deployed setting: ``session_options`` an onnxruntime ``SessionOptions``, a dict
    (``{"level": "all", "config": {...}, "intra_op_num_threads": 4}``) or None (onnxruntime's
    defaults: ORT_ENABLE_ALL); ``providers`` a list of names (default: CPU)."""
    level, config, attributes, disabled = "ORT_ENABLE_ALL", {}, {}, ()
    if session_options is None:
        pass
    elif isinstance(session_options, dict):
        options = dict(session_options)
        level = level_name(options.pop("level", "all"))
        config = {str(k): str(v) for k, v in dict(options.pop("config", {}) or {}).items()}
        disabled = tuple(sorted(str(t) for t in options.pop("disabled", ()) or ()))
        for name, value in options.items():
            if name not in _ATTRIBUTES:
                raise InputError(f"unknown deployment option {name!r}: use level, config, disabled (transformer "
                                 f"names) or one of {_ATTRIBUTES}")
            attributes[name] = value
    elif type(session_options).__name__ == "SessionOptions":
        level = str(session_options.graph_optimization_level).rsplit(".", 1)[-1]
        for key in KNOWN_CONFIG:
            try:
                config[key] = session_options.get_session_config_entry(key)
            except RuntimeError:  # not set
                pass
        for name in _ATTRIBUTES:
            value = getattr(session_options, name)
            attributes[name] = str(value).rsplit(".", 1)[-1] if name == "execution_mode" else value
        attributes = {k: v for k, v in attributes.items() if v != _DEFAULTS.get(k)}
    else:
        raise InputError(f"session_options must be an onnxruntime.SessionOptions, a dict or None, not "
                         f"{type(session_options).__name__}")
    return Setting(level=level, config=tuple(sorted(config.items())), providers=provider_list(providers),
                   disabled=disabled, attributes=tuple(sorted(attributes.items())))


_DEFAULTS = {"intra_op_num_threads": 0, "inter_op_num_threads": 0, "execution_mode": "ORT_SEQUENTIAL",
             "use_deterministic_compute": False}


def level_name(level) -> str:
    """``"all"``, ``"ORT_ENABLE_ALL"`` or a ``GraphOptimizationLevel`` as onnxruntime's enum name."""
    text = str(level).rsplit(".", 1)[-1]
    name = LEVEL_NAMES.get(text.lower(), text.upper())
    if name not in LEVELS:
        raise InputError(f"unknown optimization level {level!r}: use one of {', '.join(LEVEL_NAMES)}")
    return name


def provider_list(providers) -> tuple[str, ...]:
    """The providers asked for, CPU last as fallback; those not in this onnxruntime build refused."""
    if not providers:
        return (CPU,)
    import onnxruntime

    names = [p if isinstance(p, str) else p[0] for p in providers]  # (name, options) pairs allowed
    available = onnxruntime.get_available_providers()
    missing = [p for p in names if p not in available]
    if missing:
        raise InputError(f"providers {missing} are not in this onnxruntime build (it has {available}): "
                         "install the build that has them, or leave them out")
    return tuple(dict.fromkeys([*names, CPU]))


def parse_config(items) -> dict[str, str]:
    """``KEY=VALUE`` texts (the CLI's ``--config``) as a dict."""
    out = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InputError(f"--config {item!r} is not KEY=VALUE: write e.g. session.set_denormal_as_zero=1")
        out[key.strip()] = value.strip()
    return out
