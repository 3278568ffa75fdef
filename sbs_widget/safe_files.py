"""Writing the files the package produces into paths and folders the user names.

A name in an output folder may already be taken by a symbolic link: planted by someone else who can
write there (a shared /tmp folder, a checkout), or left by an earlier run. Opening that name for
writing (``open(path, "w")``, ``onnx.save``, ``np.savez``, ``torch.save``) writes through the link,
into whatever file it points to. Here every output file is written to a new file made in the same
folder (``mkstemp``: ``O_CREAT | O_EXCL``, never an existing name, link or not), then renamed over
the name: a link there is replaced, never followed, and a failed write leaves no partial file.

>>> import os, tempfile
>>> d = tempfile.mkdtemp()
>>> with output_path(os.path.join(d, "a.txt")) as tmp:
...     _ = open(tmp, "w").write("hello")
>>> open(os.path.join(d, "a.txt")).read()
'hello'
"""

from __future__ import annotations

import contextlib
import os

from sbs_widget.errors import InputError
from sbs_widget.safe_text import atomic_path


@contextlib.contextmanager
def output_path(path):
    """Yield a new temporary path next to ``path`` (same extension: ``np.savez`` adds none) to write
    the file into; it replaces ``path`` when the block succeeds (a link at ``path`` is replaced, its
    target untouched) and is removed when it fails. A folder at ``path`` is refused."""
    path = os.fspath(path)
    if os.path.isdir(path) and not os.path.islink(path):
        raise InputError(f"cannot write {path!r}: a folder has that name; remove it or write elsewhere")
    with atomic_path(path) as tmp:
        yield tmp


def write_text(path, text: str) -> None:
    """``text`` (UTF-8) as the file ``path``, written as ``output_path`` says."""
    with output_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(text)


def output_folder(folder) -> str:
    """``folder``, created if missing (with its parents), for files written by ``output_path``."""
    folder = os.fspath(folder)
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise InputError(f"cannot write into {folder!r}: it is a file, not a folder; give a new folder name")
    os.makedirs(folder, exist_ok=True)
    return folder
