# The image (docker/Dockerfile). Included by the top-level Makefile.
#
#   make image                      docker build, A2 base (pins image.base.a2)
#   make image-a3                   the same on the A3 base (pins image.base.a3)
#   make image BUILDER=buildah      where there is no Docker engine (auto-detected when unset)
#   make image IMAGE_ARGS='--build-arg WITH_MINDSPEED=0 --secret id=cabundle,src=ca.pem'
#   make image-cuda                 NVIDIA flavour on vLLM's official image (pins image.base.cuda)
#   make image-standin              the STAND-IN base for machines that cannot pull the real one
#   make image-standin-cuda         the same for the NVIDIA base
#   make image PINS=next            any of the above on the next pin set (its base, versions, patches)

IMAGE_NAME ?= verl-consistency
BUNDLE_VERSION = $(shell $(PYTHON) -c 'import tomllib;print(tomllib.load(open("pyproject.toml","rb"))["project"]["version"])')
# Tag from the pins: <bundle>-verl<verl>-vllm-ascend<vllm-ascend>, plus -a3 for the A3 image.
IMAGE_TAG ?= $(BUNDLE_VERSION)-verl$(call pin,upstream.verl)-vllm-ascend$(call pin,upstream.vllm_ascend)
IMAGE ?= $(IMAGE_NAME):$(IMAGE_TAG)
IMAGE_A3 ?= $(IMAGE_NAME):$(IMAGE_TAG)-a3
IMAGE_CUDA ?= $(IMAGE_NAME):$(BUNDLE_VERSION)-verl$(call pin,upstream.verl)-vllm$(call pin,upstream.vllm)-cuda
# Which build `make -s image-name` names: a2 (`make image`, also `make image-a2`), a3 (`make
# image-a3`) or cuda (`make image-cuda`); the README's cluster path sets it once for both.
# (Not FLAVOUR: that is the Dockerfile's build arg, ascend or cuda.)
IMAGE_FLAVOUR ?= a2
IMAGE_OF_a2 = $(IMAGE)
IMAGE_OF_a3 = $(IMAGE_A3)
IMAGE_OF_cuda = $(IMAGE_CUDA)
# Extra flags for the builder, e.g. --secret, --build-arg PIP_INDEX_URL=..., --no-cache.
IMAGE_ARGS ?=

# docker when a Docker engine answers, else buildah when installed, else docker (which then
# says what is wrong). `docker info` fails fast when only the client is installed.
BUILDER ?= $(shell if docker info >/dev/null 2>&1; then echo docker; \
	elif command -v buildah >/dev/null 2>&1; then echo buildah; else echo docker; fi)

VCS_REF = $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
# The pin set's build args (PIN_SET, BASE_IMAGE and the label versions), from its pins.
SET_BUILD_ARGS = $(shell VERL_CONSISTENCY_PIN_SET=$(PINS) $(PYTHON) docker/helpers/image_build.py build-args)
IMAGE_BUILD_ARGS = --build-arg VCS_REF=$(VCS_REF) --build-arg BUNDLE_VERSION=$(BUNDLE_VERSION) $(SET_BUILD_ARGS)

ifeq ($(BUILDER),buildah)
# chroot isolation and the host network: what works in an unprivileged CI container. The
# ignore file keeps .venv and caches out of the context (BuildKit finds it by itself).
IMAGE_BUILD = buildah bud --isolation chroot --network host --layers --force-rm \
	--ignorefile docker/Dockerfile.dockerignore
else
IMAGE_BUILD = DOCKER_BUILDKIT=1 docker build
endif

.PHONY: image
image: ## Build the image for A2 (docker build; BUILDER=buildah without a Docker engine).
	$(IMAGE_BUILD) $(IMAGE_BUILD_ARGS) $(IMAGE_ARGS) -f docker/Dockerfile -t $(IMAGE) .
	@echo "built $(IMAGE)"

.PHONY: image-a2
image-a2: image ## The same as `make image` (Atlas A2), named like its siblings image-a3 and image-cuda.

.PHONY: image-a3
image-a3: ## Build the image for A3 (BASE_IMAGE = pins image.base.a3).
	$(IMAGE_BUILD) $(IMAGE_BUILD_ARGS) --build-arg BASE_IMAGE=$(call pin,image.base.a3) $(IMAGE_ARGS) \
		-f docker/Dockerfile -t $(IMAGE_A3) .
	@echo "built $(IMAGE_A3)"

.PHONY: image-cuda
image-cuda: ## Build the NVIDIA image (BASE_IMAGE = pins image.base.cuda, FLAVOUR=cuda, no MindSpeed).
	$(IMAGE_BUILD) $(IMAGE_BUILD_ARGS) --build-arg BASE_IMAGE=$(call pin,image.base.cuda) \
		--build-arg FLAVOUR=cuda --build-arg WITH_MINDSPEED=0 $(IMAGE_ARGS) \
		-f docker/Dockerfile -t $(IMAGE_CUDA) .
	@echo "built $(IMAGE_CUDA)"

.PHONY: image-standin
image-standin: venv ## Build the STAND-IN base (local, named like the real base) to test `make image` offline.
	$(PY) docker/standin/build_standin.py --cache $(CACHE)

.PHONY: image-standin-cuda
image-standin-cuda: venv ## Build the STAND-IN NVIDIA base (named like pins image.base.cuda) to test `make image-cuda`.
	$(PY) docker/standin/build_standin.py --flavour cuda --cache $(CACHE)

.PHONY: image-name
image-name: ## Print the image name and tag that `make image` builds (IMAGE_FLAVOUR=a3: `make image-a3`'s, cuda: `make image-cuda`'s).
	@$(if $(IMAGE_OF_$(IMAGE_FLAVOUR)),echo $(IMAGE_OF_$(IMAGE_FLAVOUR)),echo "make image-name: \
		IMAGE_FLAVOUR=$(IMAGE_FLAVOUR) is none of a2, a3, cuda" >&2; exit 2)
