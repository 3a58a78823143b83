# syntax=docker/dockerfile:1
#
# FlashServe images, one multi-stage build:
#
#   docker build -t ghcr.io/flashserve/flashserve-operator:0.1.0 .                          the operator (default)
#   docker build --target mock-engine -t ghcr.io/flashserve/flashserve-mock-engine:0.1.0 .   `vllm` = the mock engine
#   docker build --target router -t ghcr.io/flashserve/flashserve-router:0.1.17 .           vLLM's router (spec.routing.image)
#
# The operator image installs the product alone (the repository root's package `flashserve`); only the
# mock-engine image adds the test bed (testbed/, `flashserve-testbed`), which holds the mock.
#
# The operator image runs `flashserve run` as an unprivileged user; the Helm chart gives it a read-only root
# filesystem with /tmp as an emptyDir. The mock engine answers to `vllm serve ...` on CPUs (kind clusters):
# set a serving's spec.engine.image to it. Both final stages hold only the Python runtime and a virtual
# environment: no compiler, no pip, no package caches.

# Pinned base: an exact Python patch release on Debian 12 slim. Override with
#   --build-arg PYTHON_IMAGE=python:3.12.10-slim-bookworm@sha256:<digest>
# to pin the digest your registry serves.
ARG PYTHON_IMAGE=python:3.12.10-slim-bookworm

# ---------------------------------------------------------------------------------------------- builder
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/flashserve
WORKDIR /src
# Dependencies first, so a code change does not re-download them: install the project's requirements from
# pyproject.toml alone, then the project itself without dependencies.
COPY pyproject.toml README.md ./
RUN python - <<'PY' > /tmp/requirements.txt
import tomllib
print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))
PY
RUN /opt/flashserve/bin/pip install --prefer-binary -r /tmp/requirements.txt
COPY operator ./operator
RUN /opt/flashserve/bin/pip install --no-deps .

# The mock engine's environment: the product's plus the test bed (the mock and its dependencies).
FROM builder AS mock-builder
COPY testbed ./testbed
RUN /opt/flashserve/bin/pip install --prefer-binary ./testbed

# Both final environments: bytecode compiled, no pip, no activate scripts.
FROM builder AS product-env
RUN /opt/flashserve/bin/python -m compileall -q /opt/flashserve/lib \
 && /opt/flashserve/bin/python -m pip uninstall -y pip \
 && rm -f /opt/flashserve/bin/activate*
FROM mock-builder AS mock-env
RUN /opt/flashserve/bin/python -m compileall -q /opt/flashserve/lib \
 && /opt/flashserve/bin/python -m pip uninstall -y pip \
 && rm -f /opt/flashserve/bin/activate*

# ---------------------------------------------------------------------------------------------- runtime
FROM ${PYTHON_IMAGE} AS runtime
# The Python image's own pip/setuptools are not needed at run time.
RUN python -m pip uninstall -y pip setuptools wheel 2>/dev/null; \
    groupadd --system --gid 65532 flashserve \
 && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin flashserve
ENV PATH=/opt/flashserve/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
WORKDIR /
USER 65532:65532

# ----------------------------------------------------------------------------------------------- router
# vLLM's router, the default of a serving's spec.routing.image (flashserve/facts/router.py): the PyPI wheel
# (a Rust binary with a Python launcher) in a venv of its own, nothing of the operator. Tagged with the
# router's version. The operator renders the router read-only, as this user, with /tmp as an emptyDir.
FROM ${PYTHON_IMAGE} AS router-builder
ARG VLLM_ROUTER_VERSION=0.1.17
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/vllm-router \
 && /opt/vllm-router/bin/pip install --only-binary=:all: "vllm-router==${VLLM_ROUTER_VERSION}" \
 && /opt/vllm-router/bin/python -m compileall -q /opt/vllm-router/lib \
 && /opt/vllm-router/bin/python -m pip uninstall -y pip \
 && rm -f /opt/vllm-router/bin/activate*

FROM runtime AS router
COPY --from=router-builder /opt/vllm-router /opt/vllm-router
ENV PATH=/opt/vllm-router/bin:$PATH
LABEL org.opencontainers.image.title="flashserve-router" \
      org.opencontainers.image.description="vLLM's router (vllm-router 0.1.17) as FlashServe deploys it" \
      org.opencontainers.image.licenses="Apache-2.0"
EXPOSE 8000 29000
ENTRYPOINT ["vllm-router"]

# ------------------------------------------------------------------------------------------ mock-engine
# For kind: pods of a serving run this image in place of vLLM (set the serving's spec.engine.image to it).
# FLASHSERVE_MOCK_BIND_ANY=1 allows the mock to bind a non-loopback address, so kubelet probes and Services
# can reach it (outside a container it always binds 127.0.0.1; see docs/engine-model.md).
FROM runtime AS mock-engine
COPY --from=mock-env /opt/flashserve /opt/flashserve
ENV FLASHSERVE_MOCK_BIND_ANY=1
EXPOSE 8000
ENTRYPOINT ["vllm"]

# --------------------------------------------------------------------------------------------- operator
# The default target (last stage).
FROM runtime AS operator
COPY --from=product-env /opt/flashserve /opt/flashserve
LABEL org.opencontainers.image.title="flashserve-operator" \
      org.opencontainers.image.description="Kubernetes operator serving DeepSeek-V4.1-Flash with vLLM on NVIDIA Blackwell" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="0.1.0"
EXPOSE 8081 8082
ENTRYPOINT ["flashserve", "run"]
