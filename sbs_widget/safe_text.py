"""Strings from model files, made safe where they leave the package: the terminal, spreadsheets, file
names. Model names may come from anyone (ESC sequences, bidi overrides, NUL, formula prefixes,
100k characters); the engine keeps them as they are, the output boundary calls these.

>>> visible("a\\x1b[31mb\\u202e")
'a\\\\x1b[31mb\\\\u202e'
>>> spreadsheet_cell("=HYPERLINK(1)")
"'=HYPERLINK(1)"
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile

from sbs_widget.shared_rules import HIDDEN_RANGES

# OWASP CSV injection: a cell starting with one of these is read as a formula by spreadsheets.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


# Characters a terminal, a viewer or a browser would act on, hide or reorder: C0/C1 controls (ESC,
# NUL), soft hyphen, bidi marks, overrides and isolates, zero-width and other format characters, line
# separators, lone surrogates, tag characters. The same set as js/format.js (a test holds them equal).
HIDDEN = re.compile("[" + "".join(f"\\U{a:08x}-\\U{b:08x}" for a, b in HIDDEN_RANGES) + "]")


def _escape(ch: str) -> str:
    code = ord(ch)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def clipped(s: str, limit: int = 300) -> str:
    """``s`` cut to about ``limit`` characters for a terminal line: its start and its end (where long
    generated names differ), and how long it was."""
    if len(s) <= limit:
        return s
    tail = limit // 4
    return f"{s[:limit - tail]}...[{len(s)} characters]...{s[-tail:]}"


def visible(s, *, newlines: bool = False) -> str:
    """``s`` with every hidden character (``HIDDEN``) written as a visible escape such as ``\\x1b`` or
    ``\\u202e``, as js/format.js ``visible`` does. ``newlines=True`` keeps ``\\n`` (multi-line messages).
    Backslashes are kept as they are."""
    s = s if isinstance(s, str) else str(s)
    if not HIDDEN.search(s):  # the common case, fast
        return s
    return HIDDEN.sub(lambda m: m.group(0) if newlines and m.group(0) == "\n" else _escape(m.group(0)), s)


XLSX_MAX_CELL = 32_767  # characters an Excel cell holds; openpyxl cuts silently beyond


def spreadsheet_cell(s: str, max_len: int | None = None) -> str:
    """A string cell that a spreadsheet shows as text: control and format characters made visible
    (xlsx cannot store most of them; they can hide or reorder text), and a leading apostrophe when
    the cell would otherwise start a formula. Tabs and newlines inside the text are kept. Beyond
    ``max_len`` the text is cut with a visible note naming its length and digest."""
    if s.startswith(_FORMULA_START):
        s = "'" + s
    if not s.isprintable():
        s = "".join(ch if ch.isprintable() or ch in "\t\n" else _escape(ch) for ch in s)
    if max_len is not None and len(s) > max_len:
        digest = hashlib.sha1(s.encode("utf-8", "surrogatepass")).hexdigest()[:12]
        note = f"... [cut: {len(s)} characters, sha1 {digest}]"
        s = s[:max_len - len(note)] + note
    return s


def spreadsheet_frame(df, max_len: int | None = None):
    """A copy of ``df`` with every string cell passed through ``spreadsheet_cell``; numbers, None and
    NaN are left as they are."""
    out = df.copy()
    for col in out.columns:
        if out[col].map(lambda v: isinstance(v, str)).any():  # object or str dtype alike
            out[col] = out[col].map(lambda v: spreadsheet_cell(v, max_len) if isinstance(v, str) else v)
    out.columns = [spreadsheet_cell(str(c), max_len) for c in out.columns]
    return out


_FILE_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def short_name(name: str, limit: int = 64) -> str:
    """A file- and zip-entry-safe stand-in for ``name``: ``name`` itself when short and plain, else a
    readable prefix and a digest of the whole name (distinct names stay distinct)."""
    if len(name) <= limit and not _FILE_SAFE.search(name) and name not in ("", ".", ".."):
        return name
    digest = hashlib.sha1(name.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{_FILE_SAFE.sub('_', name[:limit - 13])}_{digest}"


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path):
    """Yield a temporary path in the folder of ``path`` (same extension); it replaces ``path`` when
    the block succeeds and is removed when it fails, so a failed write never leaves a partial file."""
    path = os.fspath(path)
    folder, base = os.path.split(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{base[:40]}.", suffix=os.path.splitext(base)[1] or ".tmp")
    os.close(fd)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it private; a written file gets the usual mode
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
