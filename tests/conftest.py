"""Suite-wide settings.

Hypothesis: no deadline and no "too slow" health check. Both are timing
assertions, and these machines are noisy. The first test that draws text
in a fresh checkout also builds Hypothesis's Unicode cache (over a second).
Run alone, as ``scripts/dev test tests/unit/supervisor/test_tail.py`` does,
that test failed its first run on ``FailedHealthCheck``. Every property
still runs its examples and still fails on a counterexample."""
from __future__ import annotations

from hypothesis import HealthCheck, settings

settings.register_profile("aep", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("aep")
