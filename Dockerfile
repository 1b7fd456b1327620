# The planner service: `docker build -t mtf-planner . && docker run -p 8080:8080 -v planner-data:/data mtf-planner`
# Then the dashboard is at http://localhost:8080/ and the API docs at /docs.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    MTF_PLANNER_DATA_DIR=/data

WORKDIR /app
# The package's own files only (.dockerignore keeps the rest out).  The
# project's dependencies include tensorflow-cpu for lowering; the service never
# imports it, but one package means one install.
COPY pyproject.toml README.md ./
COPY mtf_core ./mtf_core
COPY cost_models ./cost_models
COPY layout_planner ./layout_planner
COPY api ./api
# examples/mnist.py: `mtf-planner export --model mnist` builds its graph.
COPY examples ./examples
RUN pip install . \
    && useradd --system --uid 10001 --home-dir /app --shell /usr/sbin/nologin planner \
    && mkdir -p /data && chown planner /data

USER planner
VOLUME ["/data"]
EXPOSE 8080

HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=4).status != 200)"]

CMD ["mtf-planner", "serve", "--host", "0.0.0.0", "--port", "8080"]
