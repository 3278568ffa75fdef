"""The ONNX file's initializers as numpy arrays, shared by every segment of every run: an initializer
bitwise equal to the torch parameter it comes from is served from the parameter's memory."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from sbs_widget.load.mapped_weights import PagesRead

if TYPE_CHECKING:
    from sbs_widget.align.pair import Pair


# From this size on, a weight stored transposed is transposed by the segment (onnxruntime, in the
# runner thread, alive until its last reader) rather than copied here for the whole segment: on a
# 6-layer LLaMA of hidden size 1024 (4-11 MB weights) the first run took 1.29 s instead of 1.49 and
# peaked 28 MB lower; on a 16-layer one of hidden size 64 (16-45 kB) the 113 Transpose nodes cost
# 8 ms of session building and 0.85 MB of sessions for copies that were cheap (below malloc's mmap
# threshold, no page faults). (Medians of fresh processes, measured side by side.)
TRANSPOSE_IN_SEGMENT_BYTES = 128 * 1024

# glibc raises its mmap threshold to the size of each mapped block freed (up to 32 MB); blocks below it
# come from the heaps and stay there once freed, resident. onnxruntime casts float16 weights to float32
# in every segment (8-32 MB blocks on a LLaMA of hidden size 2048, allocated and freed in its thread):
# on a 1.2 GB float16 LLaMA they kept 0.3 GB more resident at the run's peak (+0.55 GB above the
# prepared state instead of +0.26; same records, same time). A fixed threshold maps each block of this
# size or more apart, and hands it back when it is freed.
BIG_BLOCK = 4 << 20
BIG_MODEL_BYTES = 256 << 20  # weights from which a run sets it (the setting lasts for the process)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)
_big_blocks_apart = False


def big_blocks_apart() -> None:
    """Blocks of ``BIG_BLOCK`` bytes or more mapped apart from the heaps, for the process (glibc; once)."""
    global _big_blocks_apart
    if _big_blocks_apart:
        return
    _big_blocks_apart = True
    try:
        import ctypes

        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc
        return
    mallopt(_M_MMAP_THRESHOLD, BIG_BLOCK)
    mallopt(_M_TRIM_THRESHOLD, 2 * BIG_BLOCK)  # (what glibc sets with the threshold it raises)


class Weights:
    """The ONNX file's initializers, as a read-only mapping name -> numpy array.

    An initializer bitwise equal to the torch parameter it comes from (or to its transpose, the
    optimizer's folded weights) is served from the parameter's memory instead of a second copy: the
    ONNX side still computes with exactly the file's values, and the weights are held once.
    """

    def __init__(self, p: Pair, weight_bytes: int, weight_files: list):
        if weight_bytes >= BIG_MODEL_BYTES:  # before the runtime's first casts of these weights (small models:
            big_blocks_apart()  # their blocks are below the threshold anyway, and the process keeps glibc's own)
        self._arrays: dict[str, np.ndarray] = {}
        self._views: dict[str, tuple] = {}  # name -> (torch tensor, transposed?)
        self._finite: set[str] = set()  # served from torch's memory, every value finite
        params = {**p.decomposed_ep.state_dict, **{k: v for k, v in p.decomposed_ep.constants.items()
                                                    if isinstance(v, torch.Tensor)}}
        twins: dict[str, tuple[str, bool]] = {}
        for w in p.alignment.weights:
            if w.onnx_name and w.comparable:
                twins[w.onnx_name] = (w.key, w.transposed)
        for name in p.index.initializers:
            src = p.index.folded_from(name)
            if name not in twins and len(src) == 1 and src[0] in params:
                twins[name] = (src[0], True)
        read = PagesRead(weight_files)  # (a big .pt2's weights: their pages handed back as this goes)
        for name in p.index.initializers:
            arr, raw = p.index.initializer_data(name)
            twin = twins.get(name)
            if twin is not None and twin[0] in params and arr.size > 1024:
                t = params[twin[0]].detach()
                read.add(t.nbytes)
                if t.device.type == "cpu" and t.dtype != torch.bfloat16:
                    view = t.numpy()
                    view = view.T if twin[1] and view.ndim == 2 else view
                    if view.shape == arr.shape and view.dtype == arr.dtype and \
                            _same_bits(view, arr, raw, p.index, name):
                        self._views[name] = (t, twin[1] and view.ndim == 2)
                        if view.dtype.kind != "f" or np.isfinite(view).all():
                            self._finite.add(name)
                        continue
            self._arrays[name] = arr

    def __getitem__(self, name: str) -> np.ndarray:
        if name in self._arrays:
            return self._arrays[name]
        t, transposed = self._views[name]
        # A transposed view is made contiguous for the runtime: a copy alive for one segment only.
        return np.ascontiguousarray(t.numpy().T) if transposed else t.numpy()

    def __contains__(self, name) -> bool:
        return name in self._arrays or name in self._views

    def transposed_source(self, name: str) -> np.ndarray | None:
        """For a big initializer stored as the transpose of a torch parameter: that parameter's
        memory (no copy), for a segment to transpose itself; None for any other initializer."""
        view = self._views.get(name)
        if view is None or not view[1] or view[0].nbytes < TRANSPOSE_IN_SEGMENT_BYTES:
            return None
        return view[0].numpy()

    def is_exactly(self, name: str, tensor) -> bool:
        """Whether initializer ``name`` holds exactly ``tensor``'s values, with no NaN or Inf: it is
        served from the memory ``tensor`` views, in ``tensor``'s layout (a transposed twin: the
        transposed view the program makes of it). The pair's errors are 0 without measuring."""
        if name not in self._finite or type(tensor) not in _PLAIN_TENSORS:  # not a subclass with other storage
            return False
        t, transposed = self._views[name]
        if tensor.data_ptr() != t.data_ptr() or tensor.dtype != t.dtype:
            return False
        if transposed:
            return tensor.shape == t.shape[::-1] and tensor.stride() == t.stride()[::-1]
        return tensor.shape == t.shape and tensor.stride() == t.stride()

    def __iter__(self):
        yield from self._arrays
        yield from self._views

    def __len__(self) -> int:
        return len(self._arrays) + len(self._views)

    def keys(self):
        return list(self)

    @property
    def shared(self) -> int:
        """How many initializers are served from torch's memory."""
        return len(self._views)


_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)  # a program's weights are Parameters


def _same_bits(view: np.ndarray, arr: np.ndarray, raw: bytes | None, index=None, name: str = "") -> bool:
    """Whether ``view`` (torch's memory) holds exactly the file's values, bit for bit: -0.0 is not
    0.0 to the runtime (1/x), and equal NaNs are equal. Compared as bytes: one copy and a memcmp,
    ~2x faster than an element-wise comparison on transposed views. An initializer left in its file
    is compared in chunks read into a reused buffer (``InitializerFile.equals``): its pages are not
    mapped into this process, so a weight served from torch's memory is never resident twice."""
    if index is not None and index.in_file(name):
        return index.data.equals(name, view)
    return view.tobytes() == (raw if raw is not None else arr.tobytes())  # tobytes: C order, any layout
