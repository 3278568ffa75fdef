"""The report of one comparison as a file: a versioned JSON document (records, culprits, verdict,
settings, versions) that reads back, and a Markdown summary for a pull request (``markdown.py``).

The JSON follows ``report.schema.json`` (shipped beside this module, ``schema_path()``): ``schema`` is
``"sbs_widget.report"``, ``schema_version`` the version of its layout (1). Numbers that JSON cannot hold
(NaN, infinities: a NaN error, an overflow) are written as the strings ``"NaN"``, ``"Infinity"`` and
``"-Infinity"`` in numeric fields, and read back as floats. Strings are written with every non-ASCII
character escaped (``\\uXXXX``): a model name holding control or bidi characters stays inert text.

>>> rep = build_report([], atol=1e-4, rtol=1e-4)
>>> rep.verdict.outcome, rep.to_dict()["schema_version"]
('cannot-judge', 1)
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import platform
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable

from sbs_widget.errors import InputError, LoadError
from sbs_widget.gate.verdict import Verdict, check_fail_on, judge
from sbs_widget.records import RECORD_FIELDS, Record, to_dataframe

if TYPE_CHECKING:
    from sbs_widget.engine.entry import Prepared

SCHEMA_ID = "sbs_widget.report"
SCHEMA_VERSION = 1
REPORT_SUFFIXES = (".json", ".md")
MAX_REPORT_BYTES = 1 << 30  # a report is read whole: refuse a file of a gigabyte or more

_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def schema_path() -> str:
    """Path of the JSON Schema the reports follow (``report.schema.json``, shipped in the package)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "report.schema.json")


def _numeric_fields(cls) -> frozenset:
    return frozenset(f.name for f in dataclasses.fields(cls) if "float" in str(f.type))


_RECORD_NUMERIC = _numeric_fields(Record)
_CULPRIT_NUMERIC = frozenset({"score", "err_abs", "err_local"})
_VERDICT_NUMERIC = frozenset({"max_min_atol"})


def versions() -> dict:
    """The versions of what made the report: sbs_widget, torch, onnx, onnxruntime, onnxscript, numpy, Python."""
    from importlib import metadata

    from sbs_widget.version import __version__

    out = {"sbs_widget": __version__}
    for name in ("torch", "onnx", "onnxruntime", "onnxscript", "numpy"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    out["python"] = platform.python_version()
    return out


def describe_source(x) -> str | None:
    """A short text for what was compared: a path as given, else the object's type."""
    if x is None:
        return None
    if isinstance(x, (str, os.PathLike)):
        return os.fspath(x)
    if isinstance(x, (tuple, list)):
        return f"{type(x).__name__} of {len(x)} value(s)"
    return type(x).__name__


@dataclass
class Report:
    """One comparison, as written to and read from a JSON report.

    ``records``: the ``Record`` list; ``culprits``: the ``Culprit`` list (most likely first); ``verdict``:
    ``gate.verdict.Verdict``; ``settings``: atol, rtol, fail_on, runtime, node_local, precision, ...;
    ``sources``: what was compared (paths as given, or object types); ``versions``; ``created`` (UTC, ISO 8601).
    """

    records: list
    culprits: list = field(default_factory=list)
    verdict: Verdict | None = None
    settings: dict = field(default_factory=dict)
    sources: dict = field(default_factory=dict)
    versions: dict = field(default_factory=dict)
    created: str = ""
    message: str = ""

    @property
    def atol(self) -> float:
        return self.settings.get("atol", 1e-4)

    @property
    def rtol(self) -> float:
        return self.settings.get("rtol", 1e-4)

    def exit_code(self) -> int:
        return self.verdict.exit_code(self.settings.get("fail_on", "noise"))

    def to_dataframe(self):
        """The records as ``sbs_widget.to_dataframe`` gives them."""
        return to_dataframe(self.records)

    def widget(self, title: str | None = None):
        """An ``SbsWidget`` showing the records (no rerun: the programs are not in the report)."""
        from sbs_widget.views.widget import SbsWidget

        if title is None:
            title = " vs ".join(str(s) for s in (self.sources.get("onnx"), self.sources.get("ep")) if s)
        return SbsWidget.from_records(self.records, atol=self.atol, rtol=self.rtol, title=title or "")

    def to_markdown(self, **options) -> str:
        from sbs_widget.gate.markdown import to_markdown

        return to_markdown(self, **options)

    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA_ID,
            "schema_version": SCHEMA_VERSION,
            "created": self.created,
            "versions": dict(self.versions),
            "settings": dict(self.settings),
            "sources": dict(self.sources),
            "verdict": _encode(self.verdict.to_dict() if self.verdict is not None else None),
            "message": self.message,
            "culprits": [_encode(_as_dict(c)) for c in self.culprits],
            "records": [_encode(_as_dict(r)) for r in self.records],
        }

    def to_json(self, indent: int | None = None) -> str:
        # ensure_ascii: control and bidi characters of model names written as \u escapes
        return json.dumps(self.to_dict(), indent=indent, ensure_ascii=True, allow_nan=False)

    def write(self, path) -> str:
        """Write ``path`` (``.json``: the report; ``.md``: the Markdown summary), complete or not at all."""
        from sbs_widget.safe_text import atomic_path

        path = os.fspath(path)
        ext = os.path.splitext(path)[1].lower()
        if ext not in REPORT_SUFFIXES:
            raise InputError(f"cannot write {path!r}: a report is .json or .md")
        text = self.to_json(indent=1) if ext == ".json" else self.to_markdown()
        with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        return path


def _as_dict(x) -> dict:
    if isinstance(x, dict):
        return dict(x)
    return x.to_dict() if hasattr(x, "to_dict") else dataclasses.asdict(x)


def _plain(v):
    """A JSON value for ``v``: numpy scalars as Python numbers, tuples as lists, non-finite floats as strings."""
    if v is None or isinstance(v, (str, bool, int)) and not hasattr(v, "dtype"):
        return v
    if isinstance(v, float):
        if math.isfinite(v):
            return v
        return "NaN" if math.isnan(v) else "Infinity" if v > 0 else "-Infinity"
    if isinstance(v, (tuple, list)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    try:  # numpy and torch scalars
        import numpy as np

        if isinstance(v, np.bool_):
            return bool(v)
        if isinstance(v, np.integer):
            return int(v)
        if isinstance(v, np.floating):
            return _plain(float(v))
    except ImportError:  # pragma: no cover
        pass
    if hasattr(v, "item"):
        return _plain(v.item())
    return str(v)


def _encode(d: dict | None) -> dict | None:
    return None if d is None else {k: _plain(v) for k, v in d.items()}


def _decode_number(v):
    if isinstance(v, str) and v in _NONFINITE:
        return _NONFINITE[v]
    return v


def _decode(d: dict, numeric: frozenset) -> dict:
    return {k: _decode_number(v) if k in numeric else v for k, v in d.items()}


def record_from_dict(d: dict) -> Record:
    """A ``Record`` from its JSON form (unknown fields ignored, missing ones at their default)."""
    if not isinstance(d, dict):
        raise TypeError(f"a record is a JSON object, not {type(d).__name__}")
    d = _decode(d, _RECORD_NUMERIC)
    kept = {k: v for k, v in d.items() if k in RECORD_FIELDS}
    if isinstance(kept.get("histogram"), list):
        kept["histogram"] = tuple(kept["histogram"])
    metrics = kept.pop("metrics", None)
    _check_scalars(kept, "record")
    return Record(**kept, metrics=_metrics_from_json(metrics))


def _metrics_from_json(value) -> dict[str, float] | None:
    """``Record.metrics`` from its JSON form: an object of numbers (NaN and infinities as their strings),
    or null; anything else raises ``TypeError`` (a file may come from anyone)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise TypeError(f"record field 'metrics' holds {type(value).__name__}, not an object of numbers")
    out = {}
    for name, v in value.items():
        v = _decode_number(v)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"metric {name!r} holds {type(v).__name__}, not a number")
        out[str(name)] = float(v)
    return out


_SCALARS = (str, int, float, bool, type(None))


def _check_scalars(fields: dict, what: str) -> None:
    """Raise ``TypeError`` unless every field is a JSON scalar, or a sequence of them (a file may come
    from anyone: a dict where a number goes would fail far from here)."""
    for k, v in fields.items():
        items = v if isinstance(v, (list, tuple)) else (v,)
        if not all(isinstance(x, _SCALARS) for x in items):
            raise TypeError(f"{what} field {k!r} holds {type(v).__name__} of non-scalars")


def culprit_from_dict(d: dict):
    from sbs_widget.blame.culprits import Culprit

    names = {f.name for f in dataclasses.fields(Culprit)}
    if not isinstance(d, dict):
        raise TypeError(f"a culprit is a JSON object, not {type(d).__name__}")
    kept = {k: v for k, v in _decode(d, _CULPRIT_NUMERIC).items() if k in names}
    _check_scalars(kept, "culprit")
    for name in ("onnx_node", "onnx_name", "onnx_op_type", "ep_name", "ep_target"):
        kept.setdefault(name, None)
    kept.setdefault("module", "")
    kept.setdefault("score", 0.0)
    kept.setdefault("reason", "")
    return Culprit(**kept)


def build_report(records: Iterable[Record], *, culprits=None, prepared: Prepared | None = None,
                 atol: float | None = None, rtol: float | None = None, fail_on: str = "noise",
                 runtime: str = "onnxruntime",
                 node_local: bool = False, sources: dict | None = None, cannot_judge: str | None = None,
                 verdict: Verdict | None = None, message: str = "", top: int = 10) -> Report:
    """A ``Report`` of ``records`` (what ``run_aligned`` yielded). ``culprits``: as found (``None``: found
    here with ``find_culprits``, given ``prepared`` when known, only when the verdict is a mismatch);
    ``atol``/``rtol``: those of the run (``None``: the program's default with ``prepared``, else 1e-4)."""
    from sbs_widget.engine.tolerance import resolve

    check_fail_on(fail_on)
    records = list(records)
    atol, rtol = prepared.tolerance(atol, rtol) if prepared is not None else resolve(atol, rtol, None)
    verdict = verdict or judge(records, cannot_judge=cannot_judge)
    if culprits is None:
        culprits = []
        if verdict.n_mismatch:
            import warnings

            from sbs_widget.blame.culprits import find_culprits

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                culprits = list(find_culprits(records, top=top, prepared=prepared, atol=atol, rtol=rtol))
    settings = {"atol": float(atol), "rtol": float(rtol), "fail_on": fail_on,
                "runtime": runtime if isinstance(runtime, str) else getattr(runtime, "name", type(runtime).__name__),
                "node_local": bool(node_local)}
    if prepared is not None and getattr(prepared, "precision", None) is not None:
        settings["precision"] = str(prepared.precision).replace("torch.", "")
    return Report(records=records, culprits=list(culprits), verdict=verdict, settings=settings,
                  sources={k: v for k, v in (sources or {}).items() if v is not None}, versions=versions(),
                  created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  message=message)


def write_report(report, path, **options) -> str:
    """Write ``report`` (a ``Report``, or records: ``build_report(records, **options)`` first) to ``path``:
    ``.json`` (the versioned report) or ``.md`` (the Markdown summary). Returns the path."""
    if not isinstance(report, Report):
        report = build_report(report, **options)
    return report.write(path)


def report_from_dict(data: dict) -> Report:
    """A ``Report`` from the JSON document (checked for its ``schema`` and ``schema_version``)."""
    if not isinstance(data, dict) or data.get("schema") != SCHEMA_ID:
        raise LoadError(f"not an sbs_widget report: its 'schema' is not {SCHEMA_ID!r}")
    version = data.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool) or version > SCHEMA_VERSION or version < 1:
        raise LoadError(f"report schema_version {version!r}: this sbs_widget reads 1 to {SCHEMA_VERSION}; "
                        "upgrade sbs_widget to read it")
    try:
        records = [record_from_dict(r) for r in data.get("records") or []]
        culprits = [culprit_from_dict(c) for c in data.get("culprits") or []]
        v = data.get("verdict")
        verdict = None
        if isinstance(v, dict):
            names = set(Verdict.__dataclass_fields__)
            verdict = Verdict(**{k: x for k, x in _decode(v, _VERDICT_NUMERIC).items() if k in names})
        if verdict is None:
            verdict = judge(records)
    except (TypeError, ValueError, KeyError, AttributeError, RecursionError) as e:
        raise LoadError(f"a malformed report: {type(e).__name__}: {str(e)[:200]}") from None
    return Report(records=records, culprits=culprits, verdict=verdict, settings=dict(data.get("settings") or {}),
                  sources=dict(data.get("sources") or {}), versions=dict(data.get("versions") or {}),
                  created=str(data.get("created") or ""), message=str(data.get("message") or ""))


def load_report(path) -> Report:
    """Read a JSON report written by ``write_report``, ``assert_aligned(report=...)`` or
    ``python -m sbs_widget check -o report.json``. ``.to_dataframe()`` gives the records as a DataFrame,
    ``.widget()`` an ``SbsWidget`` showing them.

    Raises ``LoadError`` for a missing, unreadable or foreign file."""
    from sbs_widget.load.plain_files import check_regular_file
    from sbs_widget.load.pt2_checks import MAX_JSON_ELEMENTS, json_elements

    path = os.fspath(path)
    check_regular_file(path, "report")  # a FIFO would block the read
    try:
        size = os.path.getsize(path)
        if size >= MAX_REPORT_BYTES:
            raise LoadError(f"{path!r}: {size} bytes, too large for a report")
        with open(path, "rb") as f:
            raw = f.read()
        if json_elements(raw) > MAX_JSON_ELEMENTS:  # parsed, each value costs ~100 bytes
            raise LoadError(f"{path!r}: JSON of more than {MAX_JSON_ELEMENTS} values, more than a report holds")
        data = json.loads(raw.decode("utf-8"), parse_constant=lambda name: _NONFINITE[name])
    except LoadError:
        raise
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise LoadError(f"cannot read the report {path!r}: {type(e).__name__}: {str(e)[:200]}") from None
    return report_from_dict(data)
