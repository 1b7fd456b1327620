# The planner service, without TensorFlow:
#
#   docker build -t mtf-planner .
#   docker run -p 8080:8080 -v planner-data:/data \
#       -e MTF_PLANNER_API_TOKENS="$(openssl rand -hex 16)" mtf-planner
#
# The dashboard is then at http://localhost:8080/ and the API docs at /docs.
# The server binds 0.0.0.0 in the container, so it refuses to start without
# API tokens (or `--insecure` added to the command).  docs/service.md, "Docker".
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    MTF_PLANNER_DATA_DIR=/data

WORKDIR /app
# The service extra only: the planner, OR-tools, FastAPI, the stores.  Every
# version is pinned by constraints-service.txt (pip freeze of a clean venv of
# '.[service]'; it has no TensorFlow, and the build fails if one appears).
COPY constraints-service.txt pyproject.toml README.md ./
COPY mtf_core ./mtf_core
COPY cost_models ./cost_models
COPY layout_planner ./layout_planner
COPY api ./api
RUN pip install --constraint constraints-service.txt '.[service]' \
    && if pip show tensorflow tensorflow-cpu >/dev/null 2>&1; then \
         echo "TensorFlow must not be in the service image" >&2; exit 1; fi \
    && python -c "import api.main" \
    && useradd --system --uid 10001 --home-dir /app --shell /usr/sbin/nologin planner \
    && mkdir -p /data && chown planner /data

USER planner
VOLUME ["/data"]
EXPOSE 8080

# Liveness only (the process answers; /readyz also checks the store and the
# workers): a busy database must not get a healthy replica restarted.
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=4).status != 200)"]

CMD ["mtf-planner", "serve", "--host", "0.0.0.0", "--port", "8080"]
