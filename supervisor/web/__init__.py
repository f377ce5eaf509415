"""The daemon's own HTTP plumbing (beside the relay's, which is
:mod:`supervisor.relay`): :mod:`.http` serves an ASGI app on the daemon's
listener through :func:`bridges.core.http.serve_app` and answers
``/healthz`` (:func:`health_app`); :mod:`.mounts` lends a path of that
listener to a bridge for the length of its run (:class:`Mounts`: the ACP
tees), behind the ``Host`` guard, the no-browser-``Origin`` rule and
``AEP_TOKEN``; :mod:`.metrics` is ``/metrics`` (:class:`Metrics`: the
Prometheus registry, read from the fleet at scrape time through the
:class:`~.metrics.Watched` shape, so it never imports the fleet).
"""
from .http import health_app, serve_asgi
from .metrics import Metrics
from .mounts import Mounts

__all__ = ["http", "metrics", "mounts", "health_app", "serve_asgi", "Metrics", "Mounts"]
