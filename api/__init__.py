"""The planner service: a FastAPI app over the layout planner.

* :func:`api.main.create_app`: the app (``mtf-planner serve`` runs it with
  uvicorn); routers in :mod:`api.routes`, one per resource;
* :mod:`api.store`: plans and jobs in SQLite (default) or PostgreSQL;
* :mod:`api.workers`: solves run in spawned worker processes (never in the
  event loop, never next to TensorFlow) behind a bounded queue;
* :mod:`api.cli`: the ``mtf-planner`` command (serve, plan, export, seed);
* :mod:`api.client`: the HTTP client (``PlannerClient``) and ``mtf.auto_layout``
  with ``server=URL``; it imports none of the modules above, and httpx only
  when it talks to a server.
"""
