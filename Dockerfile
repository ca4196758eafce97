# The agentflows image: operator, runner, trigger and webhook receiver are one program.
#   docker build -t agentflows:0.1.0 .
# Runs as a non-root user (65532) with a read-only root filesystem: the runner pod spec mounts
# an emptyDir at /tmp for scratch space (python tools, MCP stdio servers).
# BASE_IMAGE: any image with Python 3.11 whose `python`/`pip` live in /usr/local, as in the default.
# hack/build-image substitutes a Debian one it builds itself where no registry is reachable.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY operator ./operator
RUN pip install --no-cache-dir --prefix=/install -c constraints.txt .

FROM ${BASE_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    LITELLM_LOCAL_MODEL_COST_MAP=True \
    HOME=/tmp
COPY --from=build /install /usr/local
USER 65532:65532
ENTRYPOINT ["agentflows"]
CMD ["--help"]
