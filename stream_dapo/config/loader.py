"""Loading: defaults <- TOML files <- environment <- ``--set``; unknown keys name the nearest valid
key; a resolved config rendered back as TOML."""

from __future__ import annotations

import difflib
import json
import logging
import os
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from stream_dapo.config.schema import Config
from stream_dapo.errors import ConfigError

ENV_PREFIX = "STREAM_DAPO__"


def _valid_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    keys: list[str] = []
    for name, field in model.model_fields.items():
        dotted = f"{prefix}{name}"
        keys.append(dotted)
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            keys.extend(_valid_keys(ann, dotted + "."))
    return keys


def _nearest(key: str) -> str:
    keys = _valid_keys(Config)
    close = difflib.get_close_matches(key, keys, n=1, cutoff=0.5)
    if not close:
        leaf = key.rsplit(".", 1)[-1]
        close = [k for k in keys if k.rsplit(".", 1)[-1] == leaf] or difflib.get_close_matches(
            leaf, [k.rsplit(".", 1)[-1] for k in keys], n=1, cutoff=0.6
        )
        close = [k for k in keys if k.rsplit(".", 1)[-1] in close]
    return f"; did you mean '{close[0]}'?" if close else ""


def _parse_value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any, source: str) -> None:
    parts = [p for p in dotted.split(".") if p]
    if not parts:
        raise ConfigError(f"{source}: empty key; write section.key=value")
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{source}: '{dotted}' goes through '{part}', which is a value, not a table")
        node = child
    node[parts[-1]] = value


def _deep_merge(base: dict[str, Any], other: Mapping[str, Any]) -> dict[str, Any]:
    for key, value in other.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            _deep_merge(base[key], value)
        else:
            base[key] = value
    return base


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for name, raw in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX):
            continue
        dotted = name[len(ENV_PREFIX) :].lower().replace("__", ".")
        _set_dotted(tree, dotted, _parse_value(raw), f"environment variable {name}")
    return tree


def _apply_preset(tree: dict[str, Any]) -> dict[str, Any]:
    """Expand algo.preset into its keys, under anything set explicitly."""
    preset = tree.get("algo", {}).get("preset")
    if preset is None:
        return tree
    from stream_dapo.core.presets import preset_overrides

    try:
        overrides = preset_overrides(preset, family="table1")  # algo.preset names Table 1's rows
    except ValueError as exc:
        raise ConfigError(f"algo.preset: {exc}") from None
    expanded: dict[str, Any] = {}
    for dotted, value in overrides.items():
        _set_dotted(expanded, dotted, value, f"preset {preset}")
    algo = tree.get("algo", {})
    shadowed = [
        f"{dotted} = {algo[key]!r} (preset: {value!r})"
        for dotted, value in overrides.items()
        if (key := dotted.split(".", 1)[1]) in algo and algo[key] != value
    ]
    if shadowed:
        logging.getLogger(__name__).warning(
            "algo.preset = %r does not set keys given explicitly (config file, environment or --set): %s. "
            "Remove them from the config, or pass the preset's values with --set, to run the preset as "
            "the paper's Table 1 row",
            preset,
            "; ".join(shadowed),
        )
    return _deep_merge(expanded, tree)


def _format_validation_error(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            value = err.get("input")
            # A misspelt table: suggest the full key of its first entry, e.g. generator.temperature.
            probe = f"{loc}.{next(iter(value))}" if isinstance(value, dict) and value else loc
            lines.append(f"unknown key '{loc}'{_nearest(probe)}")
        else:
            where = f"{loc}: " if loc else ""
            msg = err["msg"].removeprefix("Value error, ")
            lines.append(f"{where}{msg} (got {err.get('input')!r})" if loc else msg)
    return "invalid configuration:\n  " + "\n  ".join(lines)


def load_config(
    files: Sequence[str | Path] = (),
    overrides: Iterable[str] = (),
    environ: Mapping[str, str] | None = None,
) -> Config:
    """Resolve the configuration: defaults <- TOML files <- environment <- ``--set`` overrides."""
    tree: dict[str, Any] = {}
    for file in files:
        path = Path(file)
        if not path.is_file():
            raise ConfigError(f"config file {path} not found; pass an existing TOML file to --config")
        try:
            _deep_merge(tree, tomllib.loads(path.read_text()))
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    _deep_merge(tree, _env_overrides(os.environ if environ is None else environ))
    set_tree: dict[str, Any] = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ConfigError(f"--set {item!r}: expected section.key=value, e.g. --set algo.eps_high=0.28")
        _set_dotted(set_tree, key.strip(), _parse_value(raw.strip()), f"--set {item}")
    _deep_merge(tree, set_tree)
    tree = _apply_preset(tree)
    try:
        return Config.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(exc)) from None


def config_to_toml(cfg: Config) -> str:
    """Render a resolved config as TOML (None values are omitted: TOML has no null)."""
    data = cfg.model_dump(mode="json")
    out: list[str] = []

    def is_tables(value: Any) -> bool:
        return isinstance(value, list) and bool(value) and all(isinstance(v, Mapping) for v in value)

    def emit(table: Mapping[str, Any], name: str, header: str = "[{}]") -> None:
        scalars = {
            k: v
            for k, v in table.items()
            if not isinstance(v, Mapping) and not is_tables(v) and v is not None
        }
        if name:
            out.append("\n" + header.format(name))
        for key, value in scalars.items():
            out.append(f"{key} = {json.dumps(value)}")
        for key, value in table.items():
            if isinstance(value, Mapping):
                emit(value, f"{name}.{key}" if name else key)
            elif is_tables(value):  # [[data.sources]]: an array of tables, one header each
                for item in value:
                    emit(item, f"{name}.{key}" if name else key, "[[{}]]")

    emit(data, "")
    return "\n".join(out).lstrip("\n") + "\n"
