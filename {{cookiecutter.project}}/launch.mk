# Training launched on managed TPU capacity: a Vertex AI custom job or a GKE TPU slice, both running
# the project's container image (Dockerfile). The Makefile includes this file after tpu.mk, which
# gives TPU_TYPE, TPU_POD, GCP_PROJECT, ZONE and REGION. See README.md, "Where to run it".
#
#   make image [DRY_RUN=1]              build the training image and push it to Artifact Registry
#   make vertex-train [DRY_RUN=1]       submit a Vertex AI CustomJob (DRY_RUN=1 prints the request as JSON)
#   make gke-manifest > job.yaml        print the Kubernetes manifests; kubectl apply -f job.yaml

# The config a launched job trains with: the TPU config of this slice unless CONFIG is given.
LAUNCH_CONFIG = $(if $(filter command line environment,$(origin CONFIG)),$(CONFIG),$(if $(filter 1,$(TPU_POD)),configs/pod.yaml,configs/tpu.yaml))
IMAGE_TAG ?= latest

.PHONY: image vertex-train gke-manifest

# ---- The training image ------------------------------------------------------------------------
# The Dockerfile installs the project as `make setup` does on a TPU VM: tensorflow-tpu and libtpu
# (TF=2.19 or TF=2.20 picks the TensorFlow set; default: the TPU VM default of requirements.txt).
# It is pushed to the Artifact Registry repository named after the project, which must exist:
#   gcloud artifacts repositories create {{ cookiecutter.project }} --repository-format=docker --location=$(REGION)
# launch/__init__.py (image_uri) names the same address for the jobs. CLOUD_BUILD=1 builds it with
# Cloud Build instead of a local docker.
IMAGE ?= $(REGION)-docker.pkg.dev/$(GCP_PROJECT)/{{ cookiecutter.project }}/train:$(IMAGE_TAG)
DOCKER ?= docker

image: ## [launch] build the training image (Dockerfile: TPU TensorFlow + the project) and push it to IMAGE (CLOUD_BUILD=1: Cloud Build)
ifeq ($(CLOUD_BUILD),1)
	$(if $(TF),$(error CLOUD_BUILD=1 builds the TPU VM default set; TF=$(TF) needs a local docker build))
	@$(RUN) $(GCLOUD) builds submit --project=$(GCP_PROJECT) --region=$(REGION) --tag=$(IMAGE) .
else
	@$(RUN) $(GCLOUD) auth configure-docker $(REGION)-docker.pkg.dev --quiet
	@$(RUN) $(DOCKER) build $(if $(TF),--build-arg TF=$(TF)) --tag $(IMAGE) .
	@$(RUN) $(DOCKER) push $(IMAGE)
endif

# ---- Vertex AI ---------------------------------------------------------------------------------
# A custom job on one TPU v5e VM (TPU_TYPE=v5litepod-1, -4 or -8) in REGION, running the image
# IMAGE_TAG with LAUNCH_CONFIG and ARGS; data.dir and runtime.output_dir must be gs:// paths
# (DATA_DIR=gs://... sets data.dir). SPOT=1: Spot capacity. VERTEX_TENSORBOARD=projects/P/locations/
# R/tensorboards/ID streams the run's TensorBoard logs there (with VERTEX_SERVICE_ACCOUNT=...).
# See launch/vertex.py for what Vertex AI does on preemption and how the job resumes.
VERTEX_TENSORBOARD ?=
VERTEX_SERVICE_ACCOUNT ?=

vertex-train: ## [launch] train as a Vertex AI custom job on TPU_TYPE (v5e) from the image (DRY_RUN=1: print the request as JSON)
	@$(PYTHON) -m $(PACKAGE).launch.vertex --config $(LAUNCH_CONFIG) --tpu_type $(TPU_TYPE) \
		--project $(GCP_PROJECT) --region $(REGION) --image_tag $(IMAGE_TAG) $(if $(filter 1,$(SPOT)),--spot) \
		$(if $(VERTEX_TENSORBOARD),--tensorboard $(VERTEX_TENSORBOARD)) \
		$(if $(VERTEX_SERVICE_ACCOUNT),--service_account $(VERTEX_SERVICE_ACCOUNT)) $(if $(filter 1,$(DRY_RUN)),--dry_run) \
		$(if $(filter command line,$(origin DATA_DIR)),data.dir=$(DATA_DIR)) $(ARGS)

# ---- GKE ---------------------------------------------------------------------------------------
# A Job on one single-host TPU slice node of TPU_TYPE, running the image IMAGE_TAG with LAUNCH_CONFIG
# and ARGS; data.dir and runtime.output_dir must be gs:// paths. It prints the manifests; kubectl
# applies them: make gke-manifest | kubectl apply -f -. The pod runs as the Kubernetes service
# account KSA in NAMESPACE, which needs a Storage role on the bucket (Workload Identity: the
# command is in launch/gke.py, with what GKE does on preemption and how the Job resumes). SPOT=1:
# a Spot node. Multi-host slices are refused: make pod-train trains them on TPU VMs.
KSA ?= {{ cookiecutter.project }}
NAMESPACE ?= default

gke-manifest: ## [launch] print the Kubernetes Job that trains on a GKE TPU_TYPE node (YAML: make gke-manifest | kubectl apply -f -)
	@$(PYTHON) -m $(PACKAGE).launch.gke --config $(LAUNCH_CONFIG) --tpu_type $(TPU_TYPE) \
		--project $(GCP_PROJECT) --region $(REGION) --image_tag $(IMAGE_TAG) --service_account $(KSA) \
		--namespace $(NAMESPACE) $(if $(filter 1,$(SPOT)),--spot) \
		$(if $(filter command line,$(origin DATA_DIR)),data.dir=$(DATA_DIR)) $(ARGS)
