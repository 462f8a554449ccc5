# flight-exec's images (docs/deploy.md). Two targets from one build context:
#   docker build -t flight-exec-worker:0.1.0 .                            the worker (the default, last target)
#   docker build --target coordinator -t flight-exec-coordinator:0.1.0 .  flight-coordinator
# Both run as uid 10001 and need nothing writable but their spill directory and /tmp, so they
# run with a read-only root filesystem (deploy/k8s/). The base image is the only download
# besides PyPI: pass --build-arg PYTHON=<your mirror's python:3.11-slim> where Docker Hub is out of reach.
ARG PYTHON=python:3.11-slim-bookworm

# ---- the wheel, built once from the package's sources only (.dockerignore keeps the rest out)
FROM ${PYTHON} AS wheel
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY flight/ flight/
RUN python -m pip wheel --no-deps --wheel-dir /wheels .

# ---- each image's virtual environment, made where it will live (a venv is not relocatable)
FROM ${PYTHON} AS worker-venv
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=wheel /wheels /wheels
# prometheus-client: --metrics-port; the worker needs nothing else beyond the package's own dependencies.
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install /wheels/flight_exec-*.whl "prometheus-client>=0.20"

FROM ${PYTHON} AS coordinator-venv
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=wheel /wheels /wheels
# service: Flight SQL, the web view and /metrics; fleet: dnspython, for workers found in DNS.
RUN python -m venv /opt/venv \
 && wheel="$(ls /wheels/flight_exec-*.whl)" \
 && /opt/venv/bin/pip install "${wheel}[service,fleet]"

# ---- what both images share: a user that is not root, and no bytecode written at run time
FROM ${PYTHON} AS runtime
RUN groupadd --system --gid 10001 flight \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin flight
ENV PATH=/opt/venv/bin:$PATH \
    HOME=/tmp \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

FROM runtime AS coordinator
COPY --from=coordinator-venv /opt/venv /opt/venv
USER 10001:10001
EXPOSE 31337 8080
ENTRYPOINT ["flight-coordinator"]
CMD ["--host", "0.0.0.0", "--port", "31337", "--http-port", "8080"]

FROM runtime AS worker
COPY --from=worker-venv /opt/venv /opt/venv
# flight-probe: the health action, run as a plain file (python -P) so that it does not import
# the flight package: 0.5 s of CPU and 65 MB per run instead of 2 s and 140 MB, every period,
# inside the worker's limits (flight/worker/probe.py says why).
RUN probe="$(/opt/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/flight/worker/probe.py" \
 && test -f "$probe" \
 && printf '#!/bin/sh\nexec /opt/venv/bin/python -P %s "$@"\n' "$probe" > /usr/local/bin/flight-probe \
 && chmod 0755 /usr/local/bin/flight-probe \
 && mkdir -p /spill /data \
 && chown 10001:10001 /spill
USER 10001:10001
# Arrow's C++ allocations from jemalloc, as flight-worker would otherwise run itself again to have it
# (flight/worker/memory.py: it gives an idle worker's memory back).
ENV ARROW_DEFAULT_MEMORY_POOL=jemalloc
EXPOSE 50051 9090
# The worker's own defaults (grpc://127.0.0.1:50051); with TLS or a token, set FLIGHT_EXEC_PROBE_URL,
# FLIGHT_EXEC_TLS_CA, FLIGHT_EXEC_PROBE_SERVER_NAME and FLIGHT_EXEC_TOKEN_FILE (or run the worker with --public-health).
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 CMD ["/usr/local/bin/flight-probe"]
ENTRYPOINT ["flight-worker"]
CMD ["--host", "0.0.0.0", "--port", "50051", "--spill-dir", "/spill", "--data-root", "/data"]
