"""Where the shipped grammar and models are: inside the installed package, or in a checkout."""
from __future__ import annotations

from importlib import resources
from pathlib import Path


def _dir(package: str, checkout_name: str) -> Path:
    try:
        path = Path(str(resources.files(package)))
        if path.is_dir():
            return path
    except (ModuleNotFoundError, TypeError):
        pass
    return Path(__file__).resolve().parent.parent / checkout_name


def grammar_path() -> Path:
    return _dir("schedlang.grammar", "grammar") / "schedlang.lark"


def models_dir() -> Path:
    return _dir("schedlang.models", "models")


def shipped_models() -> list[str]:
    return sorted(p.stem for p in models_dir().glob("*.sched"))
