"""Where the shipped grammar and models are: inside the installed package, or in a checkout."""
from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).resolve().parent.parent  # the schedlang package


def _dir(checkout_name: str) -> Path:
    # Installed (wheel): the data sits inside the package, schedlang/<name>/ (see pyproject's
    # package-dir). In a checkout or an editable install it is at the repository's top level.
    installed = _HERE / checkout_name
    if installed.is_dir():
        return installed
    return _HERE.parent / checkout_name


def grammar_path() -> Path:
    return _dir("grammar") / "schedlang.lark"


def models_dir() -> Path:
    return _dir("models")


def shipped_models() -> list[str]:
    return sorted(p.stem for p in models_dir().glob("*.sched"))


def extension_path(name: str) -> Path:
    """A shipped `.sched` extension (models/extensions/NAME.sched): declarations that
    extend the shipped models, read after one of them (`load(model=[base, path])`)."""
    return models_dir() / "extensions" / f"{name}.sched"
