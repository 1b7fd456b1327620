"""The planner service: a FastAPI app over the layout planner.

* :func:`api.main.create_app`: the app (``mtf-planner serve`` runs it with
  uvicorn); routers in :mod:`api.routes`, one per resource;
* :mod:`api.store`: plans and jobs in SQLite (default) or PostgreSQL;
* :mod:`api.workers`: solves run in spawned worker processes (never in the
  event loop, never next to TensorFlow) behind a bounded queue;
* :mod:`api.cli`: the ``mtf-planner`` command (serve, plan, export, seed).

The HTTP client lives in :mod:`layout_planner.remote` (so that
``mtf.auto_layout(..., server=URL)`` needs nothing from this package).
"""
