# The CPU image: planner, writers, web (gunicorn), flower and the one-shot `init`.
#   docker build -f docker/cpu.Dockerfile -t kernelswarm-cpu .
# PyTorch is the CPU build (the SOL model and the problem loader import it; no CUDA libraries here).
# Without a registry: `docker/local-bases.sh` makes a Debian base with torch in /opt/venv
# (PYTHON_IMAGE=kernelswarm-local/python-torch:...; docs/deploy.md, "Without a registry").
# gunicorn and flower belong to this image only, not to the project's dependencies.
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm
FROM ${PYTHON_IMAGE}

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG GUNICORN_VERSION=23.0.0
ARG FLOWER_VERSION=2.0.1

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

# The C++ compiler: the `cpp` language builds candidates with it, torch.compile (the T_b baseline) too.
RUN apt-get update \
 && apt-get install -y --no-install-recommends g++ \
 && rm -rf /var/lib/apt/lists/*

# A base that carries /opt/venv with torch already (docker/local-bases.sh makes one) keeps it.
RUN { [ -x /opt/venv/bin/python ] || python -m venv /opt/venv; } \
 && { python -c "import torch" 2>/dev/null || pip install --index-url "${TORCH_INDEX}" "torch==${TORCH_VERSION}"; } \
 && pip install "gunicorn==${GUNICORN_VERSION}" "flower==${FLOWER_VERSION}"

# Dependencies first (a layer that changes only with pyproject.toml), then the code. The install is
# editable: the code stays in /app, where Alembic finds its migrations next to shared/db.
WORKDIR /app
COPY pyproject.toml README.md ./
RUN mkdir -p shared services kernelswarm \
 && touch shared/__init__.py services/__init__.py kernelswarm/__init__.py \
 && pip install -e ".[postgres]"
COPY shared shared
COPY services services
COPY kernelswarm kernelswarm
COPY problems problems
COPY docker/init.py docker/healthcheck.py docker/

RUN useradd --create-home --uid 10001 --user-group kernelswarm \
 && mkdir -p /var/lib/kernelswarm \
 && chown kernelswarm:kernelswarm /var/lib/kernelswarm
USER kernelswarm
ENV KERNELSWARM_HOME=/var/lib/kernelswarm \
    KERNELSWARM_PROBLEMS_DIR=/app/problems
VOLUME /var/lib/kernelswarm
CMD ["kernelswarm", "--help"]
