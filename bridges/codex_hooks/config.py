"""The Codex hook bridge's settings: the hook family's, under the
``AEP_CODEX_HOOKS_`` prefix (:mod:`bridges.hooks_common.config`)."""
from __future__ import annotations

from functools import partial

from bridges.core.settings import Setting
from bridges.hooks_common.config import from_env as _from_env
from bridges.hooks_common.config import settings

from .profile import PROFILE

__all__ = ["SETTINGS", "from_env"]

SETTINGS: tuple[Setting, ...] = settings(PROFILE)
from_env = partial(_from_env, PROFILE)
