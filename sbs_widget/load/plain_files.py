"""What a file must be before anything reads it: a regular file, and, for a zip (``.pt2``, ``torch.save``),
members stored as they are.

- A FIFO, a device or a socket given as a model or inputs path blocks the first read for ever (or
  reads without end: ``/dev/zero``): refused up front, naming what it is.
- A deflated zip member inflates to what its header says: a 2 MB ``.pt2`` may hold a 2 GiB weight. torch
  writes every member stored (uncompressed), so a compressed one is refused; the members' sizes then
  add up to at most the file's size, and every later bound on bytes is a bound on memory.
"""

from __future__ import annotations

import os
import stat
import zipfile

from sbs_widget.errors import LoadError

_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"))


def check_regular_file(path, what: str) -> None:
    """Raise ``LoadError`` unless ``path`` (links followed) is a regular file; ``what`` names its role."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise LoadError(f"{what} not found: {os.fspath(path)!r}") from None
    except OSError as e:
        raise LoadError(f"cannot read {what} {os.fspath(path)!r}: {e.strerror or e}") from None
    if stat.S_ISREG(mode):
        return
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    raise LoadError(f"{what} {os.fspath(path)!r} is {kind}, not a regular file: reading it could block or "
                    "never end; pass the path of the file itself")


def check_stored(infos: list[zipfile.ZipInfo], path, what: str) -> None:
    """Raise ``LoadError`` unless every member is stored uncompressed and all fit in the file."""
    for info in infos:
        if info.compress_type != zipfile.ZIP_STORED:
            raise LoadError(f"refused to load {info.filename!r} of {what} {os.fspath(path)!r}: it is compressed "
                            f"({info.file_size} bytes from {info.compress_size}); torch writes members "
                            "uncompressed, and a compressed one may inflate to gigabytes from a small file. "
                            "Save it again with torch.export.save / torch.save")
    total = sum(i.file_size for i in infos)
    if total > os.path.getsize(path):
        raise LoadError(f"refused to load {what} {os.fspath(path)!r}: its members claim {total} bytes, more than "
                        "the file holds; the file is truncated or edited")


def check_zip_stored(path, what: str) -> None:
    """``check_stored`` for the zip at ``path``; nothing for a file that is not a zip."""
    try:
        with zipfile.ZipFile(path) as archive:
            infos = [i for i in archive.infolist() if not i.is_dir()]
    except (zipfile.BadZipFile, OSError, ValueError):
        return  # not a zip: its reader says what it is
    check_stored(infos, path, what)
