# syntax=docker/dockerfile:1
#
# The burst worker node: Python, the hypermedia wheel (hypermedia, pipelines, autoscaler)
# with its `server` extra at pinned versions (Ray, the pipelines' libraries; no cloud SDK:
# only the head's node provider drives a cloud), and the programs the pipelines run. No
# secrets: the Ray token is mounted at run time, and the database and Redis URLs reach the
# node's actors from the head (docker/README.md).
#
#   docker build -f docker/worker.Dockerfile -t hypermedia-worker:$(git rev-parse --short HEAD) \
#       --build-arg REVISION=$(git rev-parse HEAD) .
#
# Ray refuses to start a node whose Ray or Python differs from the head's (Python to the
# patch, unless RAY_DEFAULT_PYTHON_VERSION_MATCH_LEVEL=minor): PYTHON_VERSION must be the
# head's `python3 -V`, docker/constraints.txt pins Ray, and RAY_VERSION is checked against it.

ARG PYTHON_VERSION=3.11.7
ARG DEBIAN_SUITE=bookworm

# -- build: wheels for the project and for every dependency ---------------------------------
FROM python:${PYTHON_VERSION}-slim-${DEBIAN_SUITE} AS build

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore

# A compiler for a dependency that has no wheel for this platform (this stage is not
# shipped). Debian packages are not pinned (DL3008): the suite (bookworm) keeps each on one
# release line, and an exact pin would fail the build at Debian's next security update.
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        build-essential \
        pkg-config \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /src
# Only what the wheel is built from: pyproject.toml packages hypermedia*, pipelines* and
# autoscaler*, ships etc/'s defaults as data files, and reads README.md as its long
# description (tests/integration/test_packaging.py builds the wheel from the same list).
COPY pyproject.toml README.md /src/
COPY docker/constraints.txt /src/docker/constraints.txt
COPY hypermedia /src/hypermedia
COPY pipelines /src/pipelines
COPY autoscaler /src/autoscaler
COPY etc /src/etc

# The cache mount keeps downloads between builds without putting them in a layer.
RUN --mount=type=cache,target=/root/.cache/pip \
    python -m pip wheel --wheel-dir /wheels --constraint docker/constraints.txt '.[server,ocr]'

# -- the worker image ------------------------------------------------------------------------
FROM python:${PYTHON_VERSION}-slim-${DEBIAN_SUITE} AS worker

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Ray's version as pinned in docker/constraints.txt: the build stops if they differ.
ARG RAY_VERSION=2.60.0
ARG HYPERMEDIA_UID=10001
# Debian packages added to the image, e.g. metric-compatible fonts for documents:
# "fonts-liberation2 fonts-crosextra-carlito fonts-crosextra-caladea". Give the VPS the
# same fonts, or a document renders differently depending on the node it ran on.
ARG EXTRA_APT_PACKAGES=""
ARG REVISION=unknown

LABEL org.opencontainers.image.title="hypermedia-worker" \
      org.opencontainers.image.description="hypermedia burst worker node: pipelines and Ray" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.revision="${REVISION}"

# What the pipelines run outside Python, as scripts/setup installs it on the VPS:
#   ffmpeg (and ffprobe)                      media: transcode_video, transcode_audio
#   libreoffice-{writer,calc,impress}-nogui   documents: docx_to_pdf, extract_text
#   libmagic1                                 input type sniffing (python-magic)
#   tesseract-ocr, tesseract-ocr-eng          ocr: language data (libtesseract: tesserocr wheel)
#   fonts-dejavu-core                         ocr: the searchable PDF's text layer
#   libgl1, libglib2.0-0                      ocr: rapid-layout requires the desktop OpenCV
#                                             build beside rapidocr's headless one; both
#                                             write cv2 and the last installed is loaded:
#                                             the desktop build needs libGL and GLib
#   tini                                      PID 1: reaps what killed jobs leave behind
# libvips, libheif, PDFium and the PP-OCR models come inside their wheels. Not pinned
# (DL3008), see above;
# EXTRA_APT_PACKAGES is split into words on purpose (SC2086).
# Then the runtime user (the image's default), the directory the Ray token is mounted
# into (never a file of the image), and a data directory for a head whose
# HYPERMEDIA_DATA_DIR is /var/lib/hypermedia: the actors take the head's data_dir path
# for their job workdirs.
# hadolint ignore=DL3008,SC2086
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        ffmpeg \
        fonts-dejavu-core \
        libgl1 \
        libglib2.0-0 \
        libmagic1 \
        libreoffice-calc-nogui \
        libreoffice-impress-nogui \
        libreoffice-writer-nogui \
        tesseract-ocr \
        tesseract-ocr-eng \
        tini \
        ${EXTRA_APT_PACKAGES} \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid "${HYPERMEDIA_UID}" hypermedia \
 && useradd --no-log-init --uid "${HYPERMEDIA_UID}" --gid hypermedia \
        --create-home --home-dir /home/hypermedia --shell /usr/sbin/nologin hypermedia \
 && install -d -m 0700 -o hypermedia -g hypermedia /etc/hypermedia /var/lib/hypermedia

ENV PATH="/opt/hypermedia/bin:${PATH}" \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    RAY_USAGE_STATS_ENABLED=0

# The project with its server extra, from exactly the wheels built above (no index), in
# a venv owned by root: the runtime user and the jobs can read the code, not change it. The
# wheels are bind-mounted from the build stage, so they never form a layer here. Then a
# smoke test: Ray's version, the native libraries the pipelines load, the programs they run.
# Versions are pinned by docker/constraints.txt in the build stage (DL3013).
# hadolint ignore=DL3013
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    /usr/local/bin/python -m venv /opt/hypermedia \
 && /opt/hypermedia/bin/pip install --no-cache-dir --no-index --find-links=/wheels 'hypermedia[server,ocr]' \
 && /opt/hypermedia/bin/python -c "import ray, sys; v = ray.__version__; \
sys.exit(None if v == '${RAY_VERSION}' else f'ray {v} is installed, RAY_VERSION is ${RAY_VERSION}')" \
 && /opt/hypermedia/bin/python -c "import magic, hypermedia.cli, pipelines.registry as r; \
print('pipelines:', ' '.join(r.operations()))" \
 && /opt/hypermedia/bin/python -c "from pipelines import ocr_engines as e; \
print('ocr models:', e.ppocr_model_dir(), e.layout_model_path(), 'tessdata:', \
sorted(e.tesseract_languages()))" \
 && for tool in ffmpeg ffprobe soffice tini; do \
        command -v "${tool}" >/dev/null || { echo "missing: ${tool}" >&2; exit 1; }; \
    done

WORKDIR /home/hypermedia
USER hypermedia

# No HEALTHCHECK: `ray start --block` exits when any Ray process of the node dies, which
# ends the container; that exit is the health signal. No EXPOSE: nodes run with the host's
# network (Ray picks most of its ports at random).
#
# Nothing here starts Ray by itself. A burst node's boot script (autoscaler/bootstrap.py)
# runs `ray start ...` on the host, where docker/host/ray runs it in this image as root
# with the sandbox's capabilities; a long-lived worker runs `hypermedia worker` (README).
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["hypermedia", "worker", "--help"]
