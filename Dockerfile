# sacplan service: planner + HTTP API, no torch.
#   docker build -t sacplan . && docker run -p 8000:8000 -v sacplan-data:/data sacplan
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    SACPLAN_DATA_DIR=/data

WORKDIR /app
COPY pyproject.toml README.md ./
COPY planner ./planner
COPY service ./service
COPY migrations ./migrations
RUN pip install ".[postgres]" \
    && useradd --system --uid 10001 --home-dir /app sacplan \
    && mkdir -p /data && chown sacplan /data

USER sacplan
VOLUME ["/data"]
EXPOSE 8000

HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD python -c "import urllib.request, sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4).status == 200 else 1)"

# serve upgrades the database (SQLite in /data, or SACPLAN_DATABASE_URL) before it listens.
CMD ["sacplan", "serve", "--host", "0.0.0.0", "--port", "8000"]
