# syntax=docker/dockerfile:1
#
# The burst worker node: Python, the hypermedia wheel (hypermedia, pipelines, autoscaler)
# with its `server` extra at pinned versions (Ray, the pipelines' libraries; no cloud SDK:
# only the head's node provider drives a cloud), and the programs the pipelines run. No
# secrets: the Ray token is mounted at run time, and the database and Redis URLs reach the
# node's actors from the head (docker/README.md).
#
#   docker/build            (Docker, or podman where there is no Docker engine; see there)
#   docker build -f docker/worker.Dockerfile -t hypermedia-worker:$(git rev-parse --short HEAD) \
#       --build-arg REVISION=$(git rev-parse HEAD) .
#
# BASE_IMAGE: any Debian bookworm with python3 (3.11) and its venv module: the official
# python image by default; docker/build makes one with debootstrap (Debian's python3 and
# python3-venv) where no registry of base images is reachable.
#
# Ray refuses to start a node whose Ray or Python differs from the head's (Python to the
# patch, unless RAY_DEFAULT_PYTHON_VERSION_MATCH_LEVEL=minor): the base's `python3 -V` must
# be the head's (python:3.11.7-slim-bookworm: 3.11.7; Debian's python3: 3.11.2),
# docker/constraints.txt pins Ray, and RAY_VERSION is checked against it.

ARG BASE_IMAGE=python:3.11.7-slim-bookworm

# -- build: wheels for the project and for every dependency ---------------------------------
FROM ${BASE_IMAGE} AS build

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore

# No compiler here: every pinned dependency has a wheel for x86_64 but pyvips (its sdist
# builds without one: cffi's ABI mode); a platform where one has none needs
# build-essential in this stage, never in the next. libseccomp's Python binding is not
# on PyPI: Debian's python3-seccomp is unpacked here and only its module goes to the
# image (built for Debian's 3.11, it loads in any CPython 3.11; libseccomp2 is in every
# Debian base: apt needs it). Debian packages are not pinned (DL3008): the suite
# (bookworm) keeps each on one release line, and an exact pin would fail the build at
# Debian's next security update.
# hadolint ignore=DL3008
RUN apt-get update \
 && mkdir /seccomp && cd /seccomp \
 && apt-get download python3-seccomp \
 && dpkg-deb -x python3-seccomp_*.deb root \
 && find root -name 'seccomp.cpython-311-*.so' -exec mv {} /seccomp/ \; \
 && rm -rf root ./*.deb /var/lib/apt/lists/* \
 && ls /seccomp/seccomp.cpython-311-*.so

WORKDIR /src
# The dependencies first (pyproject's own, `server` and `ocr`, at constraints.txt's pins),
# as wheels and then installed in the image's venv, /opt/hypermedia, owned by root (the
# runtime user and the jobs can read the code, not change it), with libseccomp's binding
# beside them. One OpenCV: rapid-layout asks for the desktop build (opencv-python), which
# needs libGL (Mesa: 160 MB with its LLVM) and writes the same cv2 package as RapidOCR's
# headless one; the image keeps the headless build alone (207 MB less, no libGL), which
# rapid-layout runs on (the smoke test's OCR runs the layout model). These layers are
# rebuilt only when pyproject.toml or the pins change, and
# the next stage copies the venv as it is (same base, same path). The cache mount keeps
# pip's downloads between builds without putting them in a layer. The secret
# `ca-certificates` (optional) is a CA bundle for pip where HTTPS goes through a proxy
# that re-signs it (docker/build passes the host's): read for this step, never in a layer.
# Versions are pinned by docker/constraints.txt (DL3013).
# hadolint ignore=DL3013
COPY pyproject.toml /src/
COPY docker/constraints.txt /src/docker/constraints.txt
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=secret,id=ca-certificates,target=/run/secrets/ca-certificates \
    python3 -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print(*p['dependencies'], *p['optional-dependencies']['server'], \
*p['optional-dependencies']['ocr'], sep='\n')" >/src/requirements.txt \
 && python3 -c "import tomllib; \
print(*tomllib.load(open('pyproject.toml', 'rb'))['build-system']['requires'], sep='\n')" \
        >/src/build-requirements.txt \
 && python3 -m venv /tmp/pip \
 && { [ ! -s /run/secrets/ca-certificates ] || export PIP_CERT=/run/secrets/ca-certificates; } \
 && /tmp/pip/bin/pip wheel --wheel-dir /wheels \
        --constraint docker/constraints.txt --requirement /src/requirements.txt \
 && /tmp/pip/bin/pip install --requirement /src/build-requirements.txt \
 && python3 -m venv /opt/hypermedia \
 && /opt/hypermedia/bin/pip install --no-cache-dir --no-index --find-links=/wheels \
        --constraint docker/constraints.txt --requirement /src/requirements.txt \
 && /opt/hypermedia/bin/pip uninstall --yes opencv-python \
 && /opt/hypermedia/bin/pip install --no-cache-dir --no-index --find-links=/wheels --no-deps \
        --force-reinstall --constraint docker/constraints.txt opencv-python-headless \
 && /opt/hypermedia/bin/python -c "import cv2; \
assert 'QT:' not in cv2.getBuildInformation(), 'the desktop OpenCV is loaded'" \
 && cp /seccomp/seccomp.cpython-311-*.so \
        "$(/opt/hypermedia/bin/python -c 'import sysconfig; print(sysconfig.get_path("platlib"))')/"

# Then the project alone, from only what its wheel is built from: pyproject.toml packages
# hypermedia*, pipelines* and autoscaler*, ships etc/'s defaults as data files, and reads
# README.md as its long description (tests/integration/test_packaging.py builds the wheel
# from the same list). Its build requirements came with the dependencies: no network.
# The wheel is installed into the venv under /project (pip's --root), so that the next
# stage copies what it adds (the packages, the `hypermedia` command, share/hypermedia)
# as a small layer of its own, over the dependencies' unchanged one.
COPY README.md /src/
COPY hypermedia /src/hypermedia
COPY pipelines /src/pipelines
COPY autoscaler /src/autoscaler
COPY etc /src/etc
RUN /tmp/pip/bin/pip wheel --no-deps --no-build-isolation --no-cache-dir --wheel-dir /project-wheel . \
 && /opt/hypermedia/bin/pip install --no-cache-dir --no-index --no-deps --root /project \
        /project-wheel/hypermedia-*.whl

# -- the worker image ------------------------------------------------------------------------
FROM ${BASE_IMAGE} AS worker

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Ray's version as pinned in docker/constraints.txt: the build stops if they differ.
ARG RAY_VERSION=2.60.0
ARG HYPERMEDIA_UID=10001
# Debian packages added to the image, e.g. metric-compatible fonts for documents:
# "fonts-liberation2 fonts-crosextra-carlito fonts-crosextra-caladea". Give the VPS the
# same fonts, or a document renders differently depending on the node it ran on.
ARG EXTRA_APT_PACKAGES=""
# What the pipelines run outside Python, as scripts/setup installs it on the VPS:
#   ffmpeg (and ffprobe)                      media: transcode_video, transcode_audio
#   libreoffice-{writer,calc,impress}-nogui   documents: docx_to_pdf, extract_text
#   libmagic1                                 input type sniffing (python-magic)
#   tesseract-ocr-{eng,osd}                   ocr: language and orientation data (libtesseract
#                                             is in the tesserocr wheel: not the tesseract CLI)
#   libseccomp2                               the jobs' syscall filter (with the binding from
#                                             the build stage)
#   fonts-dejavu-core                         ocr: the searchable PDF's text layer
#   redis-server                              `hypermedia run` and `hypermedia up` in the image
#                                             (the embedded default's private Redis; a worker
#                                             node never starts it): 6 MB
#   tini                                      PID 1: reaps what killed jobs leave behind
# libvips, libheif, PDFium and the PP-OCR models come inside their wheels. Manuals,
# documentation (but the copyright files) and translations are left out, and apt's
# downloads removed (a Debian base made by debootstrap does not clean them itself: 316 MB).
# Not pinned (DL3008), see above;
# EXTRA_APT_PACKAGES is split into words on purpose (SC2086).
# Then the runtime user (the image's default), the directory the Ray token is mounted
# into (never a file of the image), and a data directory for a head whose
# HYPERMEDIA_DATA_DIR is /var/lib/hypermedia: the actors take the head's data_dir path
# for their job workdirs.
# hadolint ignore=DL3008,SC2086
RUN printf '%s\n' 'path-exclude=/usr/share/doc/*' 'path-include=/usr/share/doc/*/copyright' \
        'path-exclude=/usr/share/man/*' 'path-exclude=/usr/share/locale/*' \
        >/etc/dpkg/dpkg.cfg.d/hypermedia-no-docs \
 && apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        ffmpeg \
        fonts-dejavu-core \
        libmagic1 \
        libreoffice-calc-nogui \
        libreoffice-impress-nogui \
        libreoffice-writer-nogui \
        libseccomp2 \
        redis-server \
        tesseract-ocr-eng \
        tesseract-ocr-osd \
        tini \
        ${EXTRA_APT_PACKAGES} \
 && apt-get clean \
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

# The venv with the dependencies (a layer that changes only with the pins), then the
# project over it, then a first check: Ray's version, the native libraries the pipelines
# load, the syscall filter, the OCR models and Tesseract's data, the programs the
# pipelines run (docker/smoke runs every pipeline in the built image).
COPY --from=build /opt/hypermedia /opt/hypermedia
COPY --from=build /project/ /
RUN /opt/hypermedia/bin/python -c "import ray, sys; v = ray.__version__; \
sys.exit(None if v == '${RAY_VERSION}' else f'ray {v} is installed, RAY_VERSION is ${RAY_VERSION}')" \
 && /opt/hypermedia/bin/python -c "import magic, hypermedia.cli, pipelines.registry as r; \
print('pipelines:', ' '.join(r.operations()))" \
 && /opt/hypermedia/bin/python -c "from hypermedia.sandbox import syscalls; syscalls.compile_filter()" \
 && /opt/hypermedia/bin/python -c "from pipelines import ocr_engines as e; \
print('ocr models:', e.ppocr_model_dir(), e.layout_model_path(), 'tessdata:', \
sorted(e.tesseract_languages()))" \
 && for tool in ffmpeg ffprobe soffice tini hypermedia; do \
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
# Last: a revision changes on every commit and would rebuild every layer after it.
ARG REVISION=unknown

LABEL org.opencontainers.image.title="hypermedia-worker" \
      org.opencontainers.image.description="hypermedia burst worker node: pipelines and Ray" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.revision="${REVISION}"

ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["hypermedia", "worker", "--help"]
