"""Google Cloud credentials, resolved once and quickly, before any work that needs them.

Beam, TensorFlow and gcloud each look for credentials in their own way; without any, Beam's
retry wrapper spends minutes printing tracebacks before an error that does not say what to do.
`require_credentials` runs first in every entry point that touches `gs://` or a Google Cloud
service. It finds Application Default Credentials the way google-auth does, but without waiting
for a metadata server that a workstation does not have:

1. `GOOGLE_APPLICATION_CREDENTIALS` (a key file, or any credentials file);
2. the file `gcloud auth application-default login` writes;
3. on a Google Cloud VM (a TPU VM is one; the DMI product name says so, with no network call),
   the VM's service account through the metadata server.

It then fetches an access token with a short timeout, so that an expired login or a VM created
without the cloud-platform scope fails here, in one line, instead of mid-run. `STORAGE_EMULATOR_HOST`
(a local Cloud Storage emulator, as in the tests) needs no credentials and is exempt.

A 403 from Cloud Storage later on (a bucket this identity may not read or write) is turned into one
line naming the bucket and the identity by `errors.denied_message`, which `errors.run_cli` calls; the
identity resolved here is kept in `errors.identity` for it.

Beam's and google-auth's retry logging stays off the console; `LOG_LEVEL=INFO` (or DEBUG) shows it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from . import errors
from .errors import UserError

SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)
TOKEN_TIMEOUT_S = 10.0
FIX = (
    "on a workstation run `gcloud auth application-default login`; on a TPU VM the VM's service account "
    "is used, so create the VM with --scopes=https://www.googleapis.com/auth/cloud-platform (make tpu-create "
    "does); or set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file"
)
# Loggers whose retries and fallbacks fill the console with tracebacks when credentials are missing.
NOISY_LOGGERS = ("apache_beam.utils.retry", "apache_beam.io.gcp", "google.auth", "google.cloud", "urllib3")


def remote(paths: dict[str, str | None]) -> dict[str, str]:
    """The entries of {what: path} that are on Cloud Storage."""
    return {what: path for what, path in paths.items() if path and str(path).startswith("gs://")}


def on_google_cloud() -> bool:
    """A Compute Engine or TPU VM, from the DMI product name, or the project's training image, which
    runs on Vertex AI or GKE only and says so (ON_GOOGLE_CLOUD=1 in the Dockerfile: a container may
    not see the host's DMI): no network call."""
    if os.environ.get("ON_GOOGLE_CLOUD") == "1":
        return True
    try:
        return "Google" in Path("/sys/class/dmi/id/product_name").read_text()
    except OSError:
        return False


def quiet_logging() -> None:
    """Retry and fallback logging of Beam and google-auth off the console, unless LOG_LEVEL asks for it."""
    level = os.environ.get("LOG_LEVEL", "").upper()
    if level:
        logging.getLogger().setLevel(level)
        return
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)


def _adc_source() -> str | None:
    """Where Application Default Credentials would come from, without any network call."""
    key_file = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    if key_file:
        if not Path(key_file).is_file():
            raise UserError(f"GOOGLE_APPLICATION_CREDENTIALS={key_file} is not a file; name a key file or unset it")
        return f"GOOGLE_APPLICATION_CREDENTIALS={key_file}"
    from google.auth import _cloud_sdk

    gcloud_file = _cloud_sdk.get_application_default_credentials_path()
    if Path(gcloud_file).is_file():
        return gcloud_file
    if on_google_cloud():
        return "the VM's service account"
    return None


def _describe(credentials, source: str) -> str:
    email = getattr(credentials, "service_account_email", None) or getattr(credentials, "account", None)
    if email and email != "default":
        return email
    return f"the credentials from {source}"


def require_credentials(paths: dict[str, str | None], service: str | None = None) -> str | None:
    """Resolves credentials once if any path is gs:// or a Google Cloud `service` is used; returns
    who they belong to (None when nothing needs them), kept in `errors.identity`. Raises UserError in
    one line otherwise."""
    needed = remote(paths)
    if not needed and not service:
        return None
    what = service or ", ".join(f"{name}={path}" for name, path in needed.items())
    if os.environ.get("STORAGE_EMULATOR_HOST") and not service:
        return "the local storage emulator"
    if errors.identity is not None:
        return errors.identity
    source = _adc_source()
    if source is None:
        raise UserError(f"{what} needs Google Cloud credentials and this machine has none: {FIX}")
    import google.auth
    import google.auth.exceptions
    from google.auth.transport import requests as auth_requests

    class _Request(auth_requests.Request):  # every token request with a short timeout
        def __call__(self, *args, timeout=None, **kwargs):
            return super().__call__(*args, timeout=min(timeout or TOKEN_TIMEOUT_S, TOKEN_TIMEOUT_S), **kwargs)

    quiet_logging()
    try:
        credentials, _ = google.auth.default(scopes=SCOPES)
        credentials.refresh(_Request())
    except google.auth.exceptions.DefaultCredentialsError as error:
        raise UserError(
            f"{what}: the Google Cloud credentials in {source} cannot be used ({_first_line(error)}); {FIX}"
        ) from None
    except google.auth.exceptions.RefreshError as error:
        raise UserError(
            f"{what}: Google refused the credentials in {source} ({_first_line(error)}); they may have expired "
            f"or lack the cloud-platform scope: {FIX}"
        ) from None
    except google.auth.exceptions.TransportError as error:
        raise UserError(
            f"{what}: Google Cloud could not be reached to check the credentials in {source} ({_first_line(error)}); "
            "check the network connection or HTTPS_PROXY"
        ) from None
    errors.identity = _describe(credentials, source)
    return errors.identity


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:200] if text else type(error).__name__
