"""The settings a command line brings (``--env-file``, ``--config`` /
``AEP_CONFIG``) into ``os.environ``, shared by ``run``, ``relay``,
``check`` and the client commands (:mod:`supervisor.clientcli`); split from
:mod:`supervisor.cli` to keep both near their size."""
from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import argparse


def refuse(problems: list[str]) -> int:
    """Print each configuration problem on stderr; the exit status, 2."""
    for p in problems:
        print(f"aep-bridges: config: {p}", file=sys.stderr)
    return 2


def apply_settings(args: argparse.Namespace) -> tuple[int | None, Any]:
    """``--env-file`` (the systemd-style KEY=VALUE file: launchd's way to the
    same settings) and ``--config`` / ``AEP_CONFIG`` (the TOML file,
    :mod:`supervisor.configfile`) into ``os.environ``, the process
    environment winning over both and the environment file over the config
    file (systemd's ``Environment=`` after ``EnvironmentFile=``). Returns
    ``(exit status 2 or None, the Sources)``: an unreadable or malformed file
    refuses, a misspelt name in it warns."""
    from pathlib import Path

    from . import config as config_mod
    from .configfile import Sources, read
    sources = Sources.of(os.environ)
    path = getattr(args, "env_file", None)
    if path:
        from .tools.install import read_env_file
        try:
            values = read_env_file(path)
        except (OSError, ValueError) as e:
            return refuse([f"--env-file {path}: {getattr(e, 'strerror', None) or e}"]), sources
        sources.fill(os.environ, values, f"--env-file {path}")
    cfg_path = getattr(args, "config", None) or os.environ.get("AEP_CONFIG")
    if cfg_path:
        secrets = frozenset(st.name for group in config_mod.all_settings().values()
                            for st in group if st.secret)
        values, problems, warnings = read(Path(cfg_path), known=config_mod.known_settings(),
                                          secrets=secrets)
        for w in warnings:
            print(f"aep-bridges: config: warning: {w}", file=sys.stderr)
        if problems:
            return refuse(problems), sources
        sources.fill(os.environ, values, f"config file {cfg_path}")
    return None, sources


__all__ = ["apply_settings", "refuse"]
