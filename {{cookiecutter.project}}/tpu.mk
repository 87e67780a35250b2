# Cloud TPU VM and Pod slice operations. The Makefile includes this file after project.mk, which
# holds GCP_PROJECT, ZONE, TPU_TYPE and TPU_NAME. See README.md, "Run on a TPU VM".
#
#   make tpu-create [SPOT=1 | PREEMPTIBLE=1] [QUEUED=1]    make tpu-copy tpu-setup
#   make tpu-ssh [WORKER=n]    make tpu-tunnel (TensorBoard, profiler)    make train-bg / make logs (on the VM)    make pod-train / pod-logs
#   make tpu-stop | tpu-start | tpu-delete | tpu-list | tpu-versions | tpu-info
#
# DRY_RUN=1 on any of them prints the exact commands instead of running them.

VENV ?= .venv
GCLOUD ?= gcloud
# Prints (DRY_RUN=1) or echoes and runs the command that follows, quoted for a shell.
RUN = bash scripts/run.sh

# ---- The machine this runs on ---------------------------------------------------------------
# ON_TPU_VM is 1 on a Cloud TPU VM: TPU device files exist (/dev/accel* on v2-v4, /dev/vfio/<n> on
# v5e, v5p and v6e: topology.TPU_DEVICE_GLOBS has the same patterns). TPU_VM=1 or TPU_VM=0 overrides
# the detection (scripts/setup.sh reads it too); TPU_DEVICE_ROOT is where the device files are looked for.
TPU_DEVICE_ROOT ?= /dev
ifneq ($(filter 1 true yes,$(TPU_VM)),)
ON_TPU_VM := 1
else ifneq ($(filter 0 false no,$(TPU_VM)),)
ON_TPU_VM := 0
else
ON_TPU_VM := $(if $(wildcard $(TPU_DEVICE_ROOT)/accel[0-9]* $(TPU_DEVICE_ROOT)/vfio/[0-9]*),1,0)
endif
export TPU_VM := $(ON_TPU_VM)

# libtpu's own logs (compiler, runtime, chip errors) land in TPU_LOG_DIR, one file per process and
# level (tpu_driver.<host>.<user>.log.INFO.<date>...); TPU_MIN_LOG_LEVEL is the lowest level kept
# there and TPU_STDERR_LOG_LEVEL the lowest copied to the console (0 INFO, 1 WARNING, 2 ERROR,
# 3 FATAL). Set TPU_STDERR_LOG_LEVEL=0 to watch a long first compilation. On a Pod slice the
# workers' TensorFlow servers log through the tpu-runtime service (make pod-logs WORKER=n).
export TPU_LOG_DIR ?= /tmp/tpu_logs
export TPU_MIN_LOG_LEVEL ?= 0
export TPU_STDERR_LOG_LEVEL ?= 2
export TPU_MAX_LOG_SIZE_MB ?= 1024

# A single TPU VM runs TensorFlow through PJRT with the libtpu that `make setup` installed into the
# virtual environment (TPU_PJRT=0 falls back to the stream executor). Not on worker 0 of a Pod
# slice, where TPU_LOAD_LIBRARY=0 leaves the chips to the workers' TensorFlow servers.
TPU_PJRT ?= 1
ifeq ($(ON_TPU_VM)$(TPU_PJRT)$(TPU_LOAD_LIBRARY),11)
LIBTPU_SO = $(firstword $(wildcard $(VENV)/lib/python3*/site-packages/libtpu/libtpu.so))
export NEXT_PLUGGABLE_DEVICE_USE_C_API ?= true
export TF_PLUGGABLE_DEVICE_LIBRARY_PATH ?= $(LIBTPU_SO)
endif

# ---- The TPU: type, hosts, software -----------------------------------------------------------
# The TensorFlow version a TPU VM runs: the set `make setup` installs there (requirements.txt's
# "TPU VM default" set, or TF=...; core/tensorflow_sets.py reads them).
TF ?=
TF_VERSION = $(shell python3 src/{{ cookiecutter.package }}/core/tensorflow_sets.py --tpu-vm --set '$(TF)' --print tensorflow)
TPU_GENERATION = $(firstword $(subst -, ,$(TPU_TYPE)))
TPU_SIZE = $(lastword $(subst -, ,$(TPU_TYPE)))
# Every generation puts at most 8 TensorCores (v2-v4, v5p: the number counts cores) or 8 chips
# (v5e, v6e: the number counts chips) on one host: anything bigger is a multi-host Pod slice.
TPU_POD ?= $(if $(filter 1 2 4 8,$(TPU_SIZE)),0,1)

# The TPU VM software image (gcloud --version / --runtime-version).
# * Single host: the plain Ubuntu image of each generation, because `make setup` installs
#   TensorFlow (tensorflow-tpu, libtpu) from requirements.txt into .venv; a tpu-vm-tf-* image
#   would only add a second, unused TensorFlow. These are the images Google lists for v4 and
#   older / v5e / v5p / v6e.
# * Pod slice: tpu-vm-tf-<TF_VERSION>-pod-pjrt. Only the -pod images run the tpu-runtime service,
#   the TensorFlow server every worker must run for TPUStrategy (see scripts/pod_train.sh), and
#   its TensorFlow version must equal the one `make setup` installs (TF_VERSION). `make tpu-versions` lists what
#   the zone offers; set RUNTIME_VERSION=... if it names the image differently.
RUNTIME_v2 = tpu-ubuntu2204-base
RUNTIME_v3 = tpu-ubuntu2204-base
RUNTIME_v4 = tpu-ubuntu2204-base
RUNTIME_v5litepod = v2-alpha-tpuv5-lite
RUNTIME_v5e = v2-alpha-tpuv5-lite
RUNTIME_v5p = v2-alpha-tpuv5
RUNTIME_v6e = v2-alpha-tpuv6e
RUNTIME_VERSION ?= $(if $(filter 1,$(TPU_POD)),tpu-vm-tf-$(TF_VERSION)-pod-pjrt,$(RUNTIME_$(TPU_GENERATION)))

# Checkpoints and TensorBoard logs go to gs://, and a Pod slice's TPUClusterResolver reads the
# workers' addresses from the Cloud TPU API: the VMs' service account gets the cloud-platform
# scope (what it may do is still decided by its IAM roles).
TPU_SCOPES ?= https://www.googleapis.com/auth/cloud-platform

TPU_FLAGS = --project=$(GCP_PROJECT) --zone=$(ZONE)
CAPACITY_FLAGS = $(if $(filter 1,$(SPOT)),--spot) $(if $(filter 1,$(PREEMPTIBLE)),--preemptible) $(if $(filter 1,$(RESERVED)),--reserved)
# QUEUED=1: a queued resource waits for capacity instead of failing; QUEUE_FOR=6h gives up after.
QUEUE_FOR ?=
QUEUED_FLAGS = --node-id=$(TPU_NAME) $(if $(QUEUE_FOR),--valid-until-duration=$(QUEUE_FOR))
# AUTOCHECKPOINT=1: on a maintenance event the TPU service signals the VM (SIGTERM, which training
# turns into a checkpoint and exit 143) before it acts. The flag exists in gcloud's alpha track only,
# so the create command switches to `gcloud alpha` for it.
AUTOCHECKPOINT ?=
CREATE_TRACK = $(if $(filter 1,$(AUTOCHECKPOINT)),alpha)
AUTOCHECKPOINT_FLAGS = $(if $(filter 1,$(AUTOCHECKPOINT)),--autocheckpoint-enabled)

# ---- Code on the workers -----------------------------------------------------------------------
# The project is copied to ~/$(REMOTE_DIR) on every worker, without the local-only folders.
REMOTE_DIR ?= {{ cookiecutter.project }}
COPY_EXCLUDES ?= .venv data runs logs .git .pytest_cache
# Credentials never travel to the workers (the same patterns as .gitignore); the VM's service account
# is how a worker reaches the bucket.
SECRET_EXCLUDES := *-key.json credentials*.json application_default_credentials.json .env .env.*
COPY_ARCHIVE ?= /tmp/$(TPU_NAME)-code.tar.gz
WORKER ?= 0
# The ports of `make tensorboard` and of a job's profiler server (runtime.profiler_port, `make
# profile`); `make tpu-tunnel` forwards both from the TPU VM to this machine's localhost.
TENSORBOARD_PORT ?= 6006
PROFILER_PORT ?= 9012
POD_CONFIG ?= configs/pod.yaml

# ---- Training that survives a lost SSH connection ----------------------------------------------
TRAIN_SESSION ?= train
TRAIN_LOG ?= logs/train.log

.PHONY: tpu-create tpu-list tpu-ssh tpu-tunnel tpu-stop tpu-start tpu-delete tpu-copy tpu-setup tpu-versions \
	tpu-info tpu-cleanup pod-train pod-logs train-bg logs

tpu-create: ## [tpu] create the TPU VM or Pod slice TPU_NAME (SPOT=1, PREEMPTIBLE=1, QUEUED=1 [QUEUE_FOR=6h], AUTOCHECKPOINT=1)
	$(if $(RUNTIME_VERSION),,$(error no runtime image known for TPU_TYPE=$(TPU_TYPE): set RUNTIME_VERSION=...))
ifeq ($(QUEUED),1)
	$(if $(filter 1,$(PREEMPTIBLE)),$(error queued resources have no PREEMPTIBLE=1: use SPOT=1))
	@$(RUN) $(GCLOUD) $(CREATE_TRACK) compute tpus queued-resources create $(TPU_NAME) $(TPU_FLAGS) \
		--accelerator-type=$(TPU_TYPE) --runtime-version=$(RUNTIME_VERSION) \
		--scopes=$(TPU_SCOPES) $(QUEUED_FLAGS) $(CAPACITY_FLAGS) $(AUTOCHECKPOINT_FLAGS)
	@echo "Queued. Watch it: make tpu-list QUEUED=1 (state ACTIVE means the TPU is up)"
else
	@$(RUN) $(GCLOUD) $(CREATE_TRACK) compute tpus tpu-vm create $(TPU_NAME) $(TPU_FLAGS) \
		--accelerator-type=$(TPU_TYPE) --version=$(RUNTIME_VERSION) \
		--scopes=$(TPU_SCOPES) $(CAPACITY_FLAGS) $(AUTOCHECKPOINT_FLAGS)
endif

tpu-list: ## [tpu] list the TPU VMs (QUEUED=1: and the queued resources) of the zone
	@$(RUN) $(GCLOUD) compute tpus tpu-vm list $(TPU_FLAGS)
ifeq ($(QUEUED),1)
	@$(RUN) $(GCLOUD) compute tpus queued-resources list $(TPU_FLAGS)
endif

tpu-versions: ## [tpu] list the TPU software images (RUNTIME_VERSION) the zone offers
	@$(RUN) $(GCLOUD) compute tpus tpu-vm versions list $(TPU_FLAGS)

tpu-info: ## [tpu] show the TPU settings: type, hosts, runtime image, whether this machine is a TPU VM
	@echo "GCP_PROJECT=$(GCP_PROJECT) ZONE=$(ZONE) TPU_NAME=$(TPU_NAME) TPU_TYPE=$(TPU_TYPE)"
	@echo "TPU_POD=$(TPU_POD) RUNTIME_VERSION=$(RUNTIME_VERSION) TF_VERSION=$(TF_VERSION)"
	@echo "ON_TPU_VM=$(ON_TPU_VM) TPU_LOG_DIR=$(TPU_LOG_DIR) TPU_STDERR_LOG_LEVEL=$(TPU_STDERR_LOG_LEVEL)"

tpu-ssh: ## [tpu] open a shell on the TPU VM (WORKER=n for another worker of a Pod slice)
	@$(RUN) $(GCLOUD) compute tpus tpu-vm ssh $(TPU_NAME) $(TPU_FLAGS) --worker=$(WORKER)

tpu-tunnel: ## [tpu] a shell on the TPU VM with its TensorBoard and profiler ports forwarded to this machine's localhost
	@$(RUN) $(GCLOUD) compute tpus tpu-vm ssh $(TPU_NAME) $(TPU_FLAGS) --worker=$(WORKER) -- \
		-L $(TENSORBOARD_PORT):localhost:$(TENSORBOARD_PORT) -L $(PROFILER_PORT):localhost:$(PROFILER_PORT)

tpu-stop: ## [tpu] stop the TPU VM without deleting it (tpu-start brings it back; preemptible ones cannot)
	@$(RUN) $(GCLOUD) compute tpus tpu-vm stop $(TPU_NAME) $(TPU_FLAGS)

tpu-start: ## [tpu] start the stopped TPU VM again
	@$(RUN) $(GCLOUD) compute tpus tpu-vm start $(TPU_NAME) $(TPU_FLAGS)

tpu-delete: ## [tpu] delete the TPU VM or slice (QUEUED=1: the queued resource too; YES=1 skips the prompt)
ifeq ($(QUEUED),1)
	@$(RUN) $(GCLOUD) compute tpus queued-resources delete $(TPU_NAME) $(TPU_FLAGS) --force $(if $(filter 1,$(YES)),--quiet)
else
	@$(RUN) $(GCLOUD) compute tpus tpu-vm delete $(TPU_NAME) $(TPU_FLAGS) $(if $(filter 1,$(YES)),--quiet)
endif

tpu-copy: ## [tpu] copy the project to every worker (~/REMOTE_DIR), without .venv, data, runs and logs
	@$(RUN) tar -czf $(COPY_ARCHIVE) $(addprefix --exclude=./,$(COPY_EXCLUDES)) --exclude=__pycache__ \
		$(foreach pattern,$(SECRET_EXCLUDES),--exclude='$(pattern)') .
	@$(RUN) $(GCLOUD) compute tpus tpu-vm scp $(COPY_ARCHIVE) $(TPU_NAME):$(COPY_ARCHIVE) $(TPU_FLAGS) --worker=all
	@$(RUN) $(GCLOUD) compute tpus tpu-vm ssh $(TPU_NAME) $(TPU_FLAGS) --worker=all \
		--command='mkdir -p $(REMOTE_DIR) && tar -xzf $(COPY_ARCHIVE) -C $(REMOTE_DIR) && rm -f $(COPY_ARCHIVE)'
	@$(RUN) rm -f $(COPY_ARCHIVE)

tpu-setup: ## [tpu] run `make setup` on every worker (installs make/tmux first if the image lacks them)
	@$(RUN) $(GCLOUD) compute tpus tpu-vm ssh $(TPU_NAME) $(TPU_FLAGS) --worker=all \
		--command='cd $(REMOTE_DIR) && { command -v make >/dev/null && command -v tmux >/dev/null || { sudo apt-get update -q && sudo apt-get install -y -q make tmux; }; } && make setup'

tpu-cleanup: ## [tpu] on a TPU VM: kill processes holding the chips, remove the stale libtpu lock file
	@bash scripts/tpu_cleanup.sh

pod-train: ## [tpu] start training on a Pod slice: clean every worker, then train from worker 0 (logs/pod/)
	$(if $(filter 1,$(TPU_POD)),,$(error TPU_TYPE=$(TPU_TYPE) is a single host: run `make train-bg` on the VM instead))
	@$(RUN) $(GCLOUD) compute tpus tpu-vm ssh $(TPU_NAME) $(TPU_FLAGS) --worker=all \
		--command='cd $(REMOTE_DIR) && bash scripts/tpu_cleanup.sh --restart-runtime'
	@$(RUN) $(GCLOUD) compute tpus tpu-vm ssh $(TPU_NAME) $(TPU_FLAGS) --worker=all \
		--command='$(strip cd $(REMOTE_DIR) && bash scripts/pod_train.sh $(TPU_NAME) $(POD_CONFIG) $(ARGS))'
	@echo "Training runs on worker 0. Follow it: make pod-logs (WORKER=n for the other workers' servers)"

pod-logs: ## [tpu] follow the log of a Pod slice worker over SSH (WORKER=0: the training itself)
	@$(RUN) $(GCLOUD) compute tpus tpu-vm ssh $(TPU_NAME) $(TPU_FLAGS) --worker=$(WORKER) \
		--command='tail -n 200 -F $(REMOTE_DIR)/logs/pod/worker-$(WORKER).log'

train-bg: ## [run] on the TPU VM: run `make train` in tmux, safe from SSH drops (log: logs/train.log)
	@bash scripts/tmux_run.sh $(TRAIN_SESSION) $(TRAIN_LOG) -- \
		make train $(if $(CONFIG),CONFIG=$(CONFIG)) $(if $(ARGS),ARGS='$(ARGS)')

logs: ## [run] follow the log of `make train-bg` (Ctrl-C stops following, not training)
	@$(RUN) tail -n 200 -F $(TRAIN_LOG)
