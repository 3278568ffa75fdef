"""The weights of a big ``.pt2`` read from its file as they are needed, instead of all held in memory.

``torch.export.load`` reads every weight record into memory of its own: a program with 1.2 GB of
weights holds 1.2 GB from its load to its end, on top of what the comparison itself needs. The
archive stores its weight records uncompressed and aligned, so they are mapped instead, read-only,
and the lockstep run hands the pages of the weights it has read back after each segment
(``release``): they stay in the kernel's page cache (reclaimable memory, not the process's), and a
later read maps them again. A run then holds about one segment's weights at a time, not all of them.

Only for big archives (``MAP_FROM_BYTES``; ``SBS_WIDGET_MAP_WEIGHTS=1`` always, ``=0`` never): a
mapped file must not be written to while its program lives (deleted, or replaced under its name, is
fine: the file mapped stays). A run checks first that it was not (``check_unchanged``); a file
truncated *during* a run ends the process (SIGBUS), as with any mapped file.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import warnings
import weakref
import zipfile

import torch

from sbs_widget.errors import LoadError

MAP_FROM_BYTES = 256 << 20  # archives from this size on have their weights mapped
MAP_ENV = "SBS_WIDGET_MAP_WEIGHTS"


class WeightFile(mmap.mmap):
    """A read-only map of one ``.pt2`` archive; the tensors viewing its records keep it alive."""

    path: str
    fd: int  # the file mapped, open while the map lives (unchanged)
    identity: tuple
    base: int
    stored: dict[str, int]  # record name (below the archive's folder) -> size, for records stored uncompressed

    def view(self, offset: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
        with warnings.catch_warnings():  # "the given buffer is not writable": read-only on purpose
            warnings.simplefilter("ignore", UserWarning)
            return torch.frombuffer(self, dtype=dtype, count=numel, offset=offset)

    def release(self) -> None:
        """Unmap the pages read so far: they leave this process's memory (the page cache keeps the
        file's bytes) and are read again where a tensor is read next. Safe at any time: nothing writes."""
        self.madvise(mmap.MADV_DONTNEED)

    def unchanged(self) -> bool:
        """Whether the mapped file was left as it was loaded. Checked on the file mapped (its own
        descriptor), not on the path: a file deleted, or replaced by another under its name, is still
        the one mapped; only one written in place (``torch.export.save`` to the same path) is not."""
        try:
            return _identity(os.fstat(self.fd)) == self.identity
        except OSError:
            return False

    def check_unchanged(self) -> None:
        if not self.unchanged():
            raise LoadError(
                f"the .pt2 file {self.path!r} was written to after it was loaded; its weights are read from the "
                "file as the comparison needs them, so load it again (or set SBS_WIDGET_MAP_WEIGHTS=0 to hold "
                "the weights of big programs in memory instead)")


_FILES: weakref.WeakSet[WeightFile] = weakref.WeakSet()

# A pass reading every weight (comparing them with the ONNX file, the program run in float64) hands the
# pages back after every this many bytes read, so it never holds them all at once.
RELEASE_EVERY = 64 << 20


class PagesRead:
    """Counts the bytes of weights a pass reads, and hands the pages of ``files`` back every
    ``RELEASE_EVERY`` bytes (nothing to do for weights held in memory)."""

    def __init__(self, files):
        self.files, self.bytes = list(files), 0

    def add(self, nbytes: int) -> None:
        if not self.files:
            return
        self.bytes += nbytes
        if self.bytes >= RELEASE_EVERY:
            for f in self.files:
                f.release()
            self.bytes = 0


def _identity(st: os.stat_result) -> tuple:
    return (st.st_size, st.st_mtime_ns)  # (not ctime: deleting the file changes it, not the bytes)


def _stored_sizes(path: str) -> dict[str, int]:
    """The records of the zip archive ``path`` stored uncompressed, by name below its top folder (as
    torch's reader names them), with their sizes; read from the zip's directory only."""
    try:
        with zipfile.ZipFile(path) as z:
            return {i.filename.partition("/")[2]: i.file_size for i in z.infolist()
                    if i.compress_type == zipfile.ZIP_STORED and i.compress_size == i.file_size}
    except (OSError, zipfile.BadZipFile):
        return {}


def _wanted(path: str) -> bool:
    setting = os.environ.get(MAP_ENV, "")
    if not hasattr(mmap, "MADV_DONTNEED"):  # (Windows: no way to hand pages back, so no gain)
        return False
    if setting in ("0", "1"):
        return setting == "1"
    return os.path.getsize(path) >= MAP_FROM_BYTES


def _open(path: str) -> WeightFile | None:
    with open(path, "rb") as f:
        try:
            mapped = WeightFile(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError):  # an empty file, or one that cannot be mapped: read as torch does
            return None
        mapped.path = path
        mapped.fd = os.dup(f.fileno())
        weakref.finalize(mapped, os.close, mapped.fd)
        mapped.identity = _identity(os.fstat(mapped.fd))
    mapped.stored = _stored_sizes(path)
    mapped.base = mapped.view(0, 1, torch.uint8).data_ptr()
    _FILES.add(mapped)
    return mapped


@contextlib.contextmanager
def mapped_records(path: str):
    """While loading ``path`` with torch's ``.pt2`` reader: its weight and constant records, when
    stored plainly (not pickled, uncompressed, aligned for their type, on CPU), become views of a
    read-only map of the file instead of copies. Anything else is read as torch reads it."""
    try:
        from torch.export.pt2_archive import _package
        original = _package._build_file_map
    except (ImportError, AttributeError):  # another torch: its own reading
        yield
        return
    if not _wanted(path):
        yield
        return
    mapped = _open(path)
    if mapped is None:
        yield
        return

    def build_file_map(archive_reader, config, base_dir):
        reader, found, rest = archive_reader.archive_file, {}, {}
        for key, meta in config.config.items():
            if meta.path_name in found:
                continue
            tensor = None if meta.use_pickle or meta.tensor_meta is None else \
                _mapped_record(mapped, reader, os.path.join(base_dir, meta.path_name), meta.tensor_meta)
            if tensor is None:
                rest[key] = meta
            else:
                found[meta.path_name] = tensor
        if rest:
            found.update(original(archive_reader, type(config)(config=rest), base_dir))
        return found

    _package._build_file_map = build_file_map
    try:
        yield
    finally:
        _package._build_file_map = original


def _mapped_record(mapped: WeightFile, reader, record: str, tensor_meta) -> torch.Tensor | None:
    try:
        from torch._export.serde.serialize import deserialize_device, deserialize_scalar_type
    except ImportError:  # another torch: its own reading
        return None
    dtype = deserialize_scalar_type(tensor_meta.dtype)
    if deserialize_device(tensor_meta.device) != torch.device("cpu"):
        return None
    try:
        nbytes = reader.get_record_size(record)
        offset = reader.get_record_offset(record)
    except RuntimeError:
        return None
    size = torch.empty((), dtype=dtype).element_size()
    if nbytes == 0 or nbytes % size or offset % size or offset + nbytes > len(mapped):
        return None
    if mapped.stored.get(record) != nbytes:  # compressed, or not where the zip directory says
        return None
    tensor = mapped.view(offset, nbytes // size, dtype)
    if tensor_meta.requires_grad:
        tensor.requires_grad_(True)
    return tensor


def weight_files(tensors) -> list[WeightFile]:
    """The mapped files the CPU tensors ``tensors`` view (empty for weights held in memory)."""
    files = [(f.base, f.base + len(f), f) for f in list(_FILES)]
    if not files:
        return []
    found: dict[int, WeightFile] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.device.type == "cpu":
            ptr = t.untyped_storage().data_ptr()
            for start, end, f in files:
                if start <= ptr < end:
                    found[id(f)] = f
    return list(found.values())
