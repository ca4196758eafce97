# The agentflows image: operator, runner, trigger and webhook receiver are one program.
#   docker build -t agentflows:0.1.0 .
# Runs as a non-root user (65532) with a read-only root filesystem: the runner pod spec mounts
# an emptyDir at /tmp for scratch space (python tools, MCP stdio servers).
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY operator ./operator
RUN pip install --no-cache-dir --prefix=/install -c constraints.txt .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    LITELLM_LOCAL_MODEL_COST_MAP=True \
    HOME=/tmp
COPY --from=build /install /usr/local
USER 65532:65532
ENTRYPOINT ["agentflows"]
CMD ["--help"]
