"""Reading an ONNX file without holding its weights.

``onnx.load`` holds every initializer in the message, and while it parses, the file's bytes too: on a
LLaMA with 1.17 GB of weights, +1.22 GB resident and a transient 3.94 GB. Here the graph is read
without the tensor data:

- a single-file model: the protobuf wire format is walked over a memory map of the file (ModelProto
  field 7, the graph; GraphProto field 5, an initializer; TensorProto field 9, its raw bytes), and the
  model is rebuilt without the raw bytes of big initializers, each one described as EXTERNAL data
  pointing at the ``.onnx`` file itself, at the offset its bytes have there (onnxruntime reads that
  when the model is given by path in that folder);
- external data: the references are kept as the file gives them (``onnx.load(load_external_data=False)``
  does no more), checked: the location stays inside the model's folder, offset and length inside
  the file, the length is what the shape needs.

``InitializerFile`` then serves the bytes: a read-only memory map per file (no page resident until
read), and reads in chunks into a buffer the caller reuses (the weights are compared with the torch
parameters this way: the file's pages never all become resident at once).
"""

from __future__ import annotations

import math
import mmap
import os
import threading

import numpy as np
import onnx

from sbs_widget.dtypes import ONNX_TO_NUMPY
from sbs_widget.errors import LoadError
from sbs_widget.load.onnx_checks import check_tensor, expected_bytes

# Initializers from this many bytes on are left in the file; the smaller ones (shapes, axes, scalars:
# everything segments copy into their models) keep their bytes in the message.
BIG = 64 * 1024
# Never left in the file, whatever BIG says: initializers up to this many elements are copied as they are
# into segment and node-local models (``engine.segments.SMALL_INITIALIZER``), which read their TensorProto.
KEEP_ELEMENTS = 256

_MODEL_GRAPH, _GRAPH_INITIALIZER = 7, 5
_T_DIMS, _T_DATA_TYPE, _T_NAME, _T_RAW, _T_EXTERNAL, _T_LOCATION = 1, 2, 8, 9, 13, 14


class Malformed(ValueError):
    """The bytes are not the protobuf this reader expects: the caller falls back to ``onnx.load``."""


def read_varint(buf, pos: int, end: int) -> tuple[int, int]:
    """The varint at ``pos`` in ``buf`` (before ``end``) and the position after it."""
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise Malformed("truncated varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _fields(buf, pos: int, end: int):
    """``(field number, wire type, record start, value start, record end)`` of each field in ``[pos, end)``;
    for a varint, value start is the value itself."""
    while pos < end:
        start = pos
        key, pos = read_varint(buf, pos, end)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = read_varint(buf, pos, end)
            yield field, wire, start, value, pos
            continue
        if wire == 2:
            length, pos = read_varint(buf, pos, end)
            value, pos = pos, pos + length
        elif wire == 1:
            value, pos = pos, pos + 8
        elif wire == 5:
            value, pos = pos, pos + 4
        else:  # groups: never written by onnx
            raise Malformed(f"wire type {wire}")
        if pos > end:
            raise Malformed("a field runs past its message")
        yield field, wire, start, value, pos


def encode_varint(n: int) -> bytes:
    """``n`` as a protobuf varint."""
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _record(field: int, payload: bytes) -> bytes:
    return encode_varint((field << 3) | 2) + encode_varint(len(payload)) + payload


def _expected_bytes(data_type: int, dims: list[int]) -> int | None:
    dtype = ONNX_TO_NUMPY.get(data_type)
    if dtype is None or any(d < 0 for d in dims):
        return None
    return math.prod(dims) * np.dtype(dtype).itemsize


def _lean_tensor(buf, start: int, end: int, location: str) -> tuple[list, tuple | None]:
    """The pieces of a TensorProto with its raw bytes left out (and described as external data), and
    ``(name, offset, length)``; or ``[buf[start:end]], None`` to keep the tensor as it is."""
    dims: list[int] = []
    data_type = 0
    name = raw = None
    external = False
    for field, wire, _, value, stop in _fields(buf, start, end):
        if field == _T_DIMS:
            if wire == 0:
                dims.append(value)
            else:  # packed
                pos = value
                while pos < stop:
                    d, pos = read_varint(buf, pos, stop)
                    dims.append(d)
        elif field == _T_DATA_TYPE and wire == 0:
            data_type = value
        elif field == _T_NAME and wire == 2:
            name = bytes(buf[value:stop]).decode("utf-8")
        elif field == _T_RAW and wire == 2:
            raw = (value, stop - value)
        elif field == _T_EXTERNAL or field == _T_LOCATION and value != onnx.TensorProto.DEFAULT:
            external = True
    if raw is None or external or name is None or raw[1] < BIG or raw[1] != _expected_bytes(data_type, dims) \
            or math.prod(dims) <= KEEP_ELEMENTS:
        return [buf[start:end]], None  # kept: small, already external, or sized wrong (check_tensor says so)
    pieces = []
    for field, _, rec_start, _, stop in _fields(buf, start, end):
        if field != _T_RAW and field != _T_LOCATION:
            pieces.append(buf[rec_start:stop])
    for key, value in (("location", location), ("offset", str(raw[0])), ("length", str(raw[1]))):
        pieces.append(_record(_T_EXTERNAL, _record(1, key.encode()) + _record(2, value.encode())))
    pieces.append(encode_varint(_T_LOCATION << 3) + encode_varint(onnx.TensorProto.EXTERNAL))
    return pieces, (name, raw[0], raw[1])


def lean_model_bytes(buf, location: str) -> tuple[bytes, dict[str, tuple[int, int]]]:
    """The serialized model in ``buf`` (the file's bytes: ``FileBytes``, or bytes) with the raw bytes of its big
    initializers left out: ``(model bytes, {initializer: (offset, length)})``. Only the headers of
    the tensor records are read: the weights' pages are not touched."""
    out: list = []
    refs: dict[str, tuple[int, int]] = {}
    for field, wire, start, value, stop in _fields(buf, 0, len(buf)):
        if field != _MODEL_GRAPH or wire != 2:
            out.append(buf[start:stop])
            continue
        graph: list = []
        for g_field, g_wire, g_start, g_value, g_stop in _fields(buf, value, stop):
            if g_field == _GRAPH_INITIALIZER and g_wire == 2:
                pieces, ref = _lean_tensor(buf, g_value, g_stop, location)
                if ref is None:
                    graph.append(buf[g_start:g_stop])
                    continue
                tensor = b"".join(pieces)
                graph.append(_record(_GRAPH_INITIALIZER, tensor))
                refs[ref[0]] = ref[1:]
            else:
                graph.append(buf[g_start:g_stop])
        out.append(_record(_MODEL_GRAPH, b"".join(graph)))
    return b"".join(out), refs


class FileBytes:
    """A file's bytes read on demand with ``pread`` through a small window: the walk reads the records'
    headers only, and no page of the file is mapped into the process (a memory map's fault-around
    made ~7% of the weights resident while only their headers were read)."""

    WINDOW = 16 * 1024

    def __init__(self, fd: int):
        self.fd = fd
        self.size = os.fstat(fd).st_size
        self._start = 0
        self._window = b""

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, key):
        if isinstance(key, slice):
            start, stop = key.start, key.stop
            if self._start <= start and stop <= self._start + len(self._window):
                return self._window[start - self._start:stop - self._start]
            return os.pread(self.fd, stop - start, start) if stop - start < (1 << 30) else _pread_all(
                self.fd, stop - start, start)
        offset = key - self._start
        if not 0 <= offset < len(self._window):
            if not 0 <= key < self.size:
                raise Malformed("read past the end of the file")
            self._start, self._window = key, os.pread(self.fd, self.WINDOW, key)
            offset = 0
        return self._window[offset]


class InitializerFile:
    """Where the bytes of the initializers left in files lie, and read access to them.

    ``refs``: name -> (file number, offset, length); each file is opened once, mapped read-only."""

    CHUNK = 8 << 20  # bytes read at a time when compared

    def __init__(self):
        self.refs: dict[str, tuple[int, int, int]] = {}
        self.paths: list[str] = []
        self._fds: list[int] = []
        self._maps: list[mmap.mmap | None] = []
        self._lock = threading.Lock()
        self._buffer: bytearray | None = None

    def _file(self, path: str, fd: int | None = None) -> int:
        real = os.path.realpath(path)
        if real in self.paths:
            if fd is not None:
                os.close(fd)
            return self.paths.index(real)
        fd = os.open(real, os.O_RDONLY) if fd is None else fd
        size = os.fstat(fd).st_size
        self.paths.append(real)
        self._fds.append(fd)
        self._maps.append(mmap.mmap(fd, size, access=mmap.ACCESS_READ) if size else None)
        return len(self.paths) - 1

    def add(self, name: str, path: str, offset: int, length: int, fd: int | None = None) -> None:
        self.refs[name] = (self._file(path, fd), offset, length)

    def size(self, name: str) -> int:
        return self.refs[name][2]

    def file_size(self, name: str) -> int:
        return os.fstat(self._fds[self.refs[name][0]]).st_size

    def __contains__(self, name) -> bool:
        return name in self.refs

    def array(self, name: str, dtype, shape) -> np.ndarray:
        """The initializer's values, read-only, mapped from the file (resident only once read)."""
        k, offset, length = self.refs[name]
        dtype = np.dtype(dtype)
        if self._maps[k] is None or length == 0:
            return np.zeros(shape, dtype)
        arr = np.frombuffer(self._maps[k], dtype=dtype, count=length // dtype.itemsize, offset=offset)
        return arr.reshape(shape)

    def read(self, name: str) -> bytes:
        """The initializer's bytes (a copy: for a model that embeds it)."""
        k, offset, length = self.refs[name]
        return _pread_all(self._fds[k], length, offset)

    def equals(self, name: str, values: np.ndarray) -> bool:
        """Whether ``values`` (any layout, e.g. a transposed view of a torch parameter) holds exactly
        the file's bytes for ``name``, C order. Read in chunks into one reused buffer: the file's pages
        go through the page cache, never all resident in this process."""
        k, offset, length = self.refs[name]
        if values.nbytes != length:
            return False
        if length == 0:
            return True
        rows = values.reshape(-1) if values.flags.c_contiguous else values
        if rows.ndim == 0:
            rows = rows.reshape(1)
        row_bytes = max(1, rows[0].nbytes if rows.ndim > 1 else rows.itemsize)
        step = max(1, self.CHUNK // row_bytes)
        with self._lock:
            if self._buffer is None or len(self._buffer) < min(length, max(self.CHUNK, row_bytes)):
                self._buffer = bytearray(min(length, max(self.CHUNK, row_bytes)))
            view = memoryview(self._buffer)
            done = 0
            for r in range(0, len(rows), step):
                part = np.ascontiguousarray(rows[r:r + step]).reshape(-1).view(np.uint8)
                n = part.nbytes
                _preadv_all(self._fds[k], view[:n], offset + done)
                if not np.array_equal(np.frombuffer(view[:n], dtype=np.uint8), part):
                    return False
                done += n
        return done == length

    def close(self) -> None:
        for fd in self._fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds = []

    def __del__(self):
        self.close()


def _pread_all(fd: int, length: int, offset: int) -> bytes:
    out = bytearray(length)
    _preadv_all(fd, memoryview(out), offset)
    return bytes(out)


def _preadv_all(fd: int, view: memoryview, offset: int) -> None:
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n <= 0:
            raise LoadError("an ONNX data file became shorter while it was read")
        done += n


def _open_external(base_dir: str, location: str, name: str) -> int:
    """A file descriptor on the external data file, the location checked as ``onnx.load`` checks it
    (relative, inside the model's folder, no link out of it)."""
    try:
        from onnx.external_data_helper import _open_external_data_fd as onnx_open
    except ImportError:  # pragma: no cover - older onnx: the same rules, checked here
        onnx_open = None
    if onnx_open is not None:
        return onnx_open(base_dir, location, name, True)
    parts = location.replace("\\", "/").split("/")  # pragma: no cover
    if not location or os.path.isabs(location) or ".." in parts:
        raise ValueError(f"external data location {location!r} of {name!r} leaves the model's folder")
    path = os.path.join(base_dir, location)
    real_base = os.path.realpath(base_dir)
    if os.path.commonpath([os.path.realpath(path), real_base]) != real_base:
        raise ValueError(f"external data location {location!r} of {name!r} links out of the model's folder")
    return os.open(path, os.O_RDONLY)


def read_lean(path: str) -> tuple[onnx.ModelProto, InitializerFile]:
    """The model at ``path`` without the bytes of its big initializers, and where those bytes lie.

    Raises ``Malformed`` for bytes this reader does not follow (the caller loads with ``onnx.load``,
    whose error says what is wrong), ``LoadError`` for external data that cannot be what the model
    says."""
    data = InitializerFile()
    location = os.path.basename(path)
    with open(path, "rb") as f:
        model_bytes, refs = lean_model_bytes(FileBytes(f.fileno()), location)
    try:
        model = onnx.ModelProto.FromString(model_bytes)
    except Exception as e:  # (DecodeError) what onnx.load raises, with its words
        raise Malformed(str(e)) from e
    del model_bytes
    for name, (offset, length) in refs.items():
        data.add(name, path, offset, length)
    base_dir = os.path.dirname(os.path.abspath(path))
    for t in model.graph.initializer:
        if t.data_location != onnx.TensorProto.EXTERNAL or t.name in refs:
            continue
        info = {e.key: e.value for e in t.external_data}
        where = f"ONNX model {path!r}: initializer {t.name!r}"
        check_tensor(t, f"initializer {t.name!r}", f"ONNX model {path!r}")  # dims and type, before any read
        try:
            fd = _open_external(base_dir, info.get("location", ""), t.name)
            offset = int(info.get("offset") or 0)
            file_size = os.fstat(fd).st_size
            length = int(info["length"]) if info.get("length") else file_size - offset
        except Exception as e:  # onnx's checks raise their own types
            raise LoadError(f"cannot load ONNX model {path!r} ({type(e).__name__}: {e}); the file is truncated, "
                            "corrupt, or its external data files are not next to it") from e
        if offset < 0 or length < 0 or offset + length > file_size:
            os.close(fd)
            raise LoadError(f"{where} reads bytes {offset} to {offset + length} of {info.get('location')!r}, "
                            f"which holds {file_size}: the data file is truncated or belongs to another model; "
                            "export or save the model again")
        expected = expected_bytes(t.data_type, t.dims)  # every fixed-size type, bfloat16 and 4-bit too
        if expected is not None and length != expected:
            os.close(fd)
            raise LoadError(
                f"{where} ({onnx.TensorProto.DataType.Name(t.data_type)}, shape {list(t.dims)}) holds {length} "
                f"bytes of data where its shape needs {expected}; the file is truncated or was edited: export "
                "or save the model again")
        data.add(t.name, os.path.join(base_dir, info["location"]), offset, length, fd)
        if length < BIG or math.prod(t.dims) <= KEEP_ELEMENTS:  # small: its bytes in the message, as onnx.load
            t.CopyFrom(with_data(t, data))
            del data.refs[t.name]
    return model, data


def with_data(tensor: onnx.TensorProto, data: InitializerFile | None) -> onnx.TensorProto:
    """``tensor`` with its bytes in the message (a copy), for a model that embeds it; ``tensor`` itself
    when they are there already."""
    if data is None or tensor.name not in data or tensor.data_location != onnx.TensorProto.EXTERNAL:
        return tensor
    full = onnx.TensorProto()
    full.CopyFrom(tensor)
    full.ClearField("external_data")
    full.data_location = onnx.TensorProto.DEFAULT
    full.raw_data = data.read(tensor.name)
    return full


def model_with_data(model: onnx.ModelProto, data: InitializerFile | None) -> onnx.ModelProto:
    """``model`` with every initializer left in its file read back into the message (a copy): for a
    consumer that writes or hands the whole model elsewhere (a session in another folder, another
    process). ``model`` itself when nothing was left in a file. Holds the weights once more: only for
    whole-model checks, never the lockstep."""
    if data is None or not data.refs:
        return model
    full = onnx.ModelProto()
    full.CopyFrom(model)
    for t in full.graph.initializer:
        if t.name in data.refs and t.data_location == onnx.TensorProto.EXTERNAL:
            t.CopyFrom(with_data(t, data))
    return full
