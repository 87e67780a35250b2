# The answers given when this project was generated, in one place. Every make target that talks
# to Google Cloud reads them from here; override any of them per call: `make tpu-create ZONE=...`.
GCP_PROJECT ?= {{ cookiecutter.gcp_project }}
ZONE ?= {{ cookiecutter.zone }}
# Dataflow runs in the region that holds the TPU zone (us-central2-b -> us-central2).
REGION ?= $(shell echo '$(ZONE)' | sed -E 's/-[a-z]$$//')
GCS_BUCKET ?= {{ cookiecutter.gcs_bucket }}
TPU_TYPE ?= {{ cookiecutter.tpu_type }}
TPU_NAME ?= {{ cookiecutter.project }}
