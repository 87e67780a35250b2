"""A local Google Cloud Storage for tests: real ``gs://`` paths, no network.

The session fixture ``gcs_bucket`` starts one child process (this file run as a
script) that serves two things on free loopback ports:

* **gcp-storage-emulator**, a pure-Python fake of the GCS JSON API, kept in memory.
  Beam's GCS IO (``FileSystems``, ``WriteToText``, its batched copy, rename and
  delete) goes through the google-cloud-storage client, which talks to the emulator
  directly because ``STORAGE_EMULATOR_HOST`` names it.

* **a TLS-terminating HTTPS proxy, for TensorFlow.** TF's own ``gs://`` filesystem
  (``tf.io.gfile``, ``tf.data``, checkpoints, summary writers) has no endpoint
  setting: it always calls https://www.googleapis.com and
  https://storage.googleapis.com. Its libcurl does honour ``HTTPS_PROXY`` and
  ``CURL_CA_BUNDLE``, so the proxy accepts ``CONNECT`` to those two hosts, completes
  TLS with a certificate signed by a throwaway CA made at start-up (the CA that
  ``CURL_CA_BUNDLE`` names), and passes each decrypted request on to the emulator.
  ``HTTP_PROXY`` and the metadata-server variables point at the proxy too, so
  anything else that would leave the machine (another host, such as Beam's
  DirectRunner downloading Prism from github.com; a metadata-server probe) is
  refused at once with 403 and logged as a ``BLOCKED`` line, which
  ``GcsBucket.blocked_requests()`` returns. Loopback addresses are in ``NO_PROXY``.

Nothing looks for real Google credentials:

* TF takes ``GOOGLE_AUTH_TOKEN_FOR_TESTING`` before any other source, so it never
  reads credential files or asks the GCE metadata server.
* Beam calls ``google.auth.default()`` and, when that finds nothing, retries for
  15-20 s before going anonymous. ``GOOGLE_APPLICATION_CREDENTIALS`` therefore
  names a fake authorized-user file holding an access token that never expires:
  google-auth loads it at once and never refreshes it; the emulator ignores it.
* ``NO_GCE_CHECK=true`` tells both TF and google-auth not to probe for a GCE
  metadata server (169.254.169.254), should they get that far.

The server runs once per session (``gcs_server``); its variables are in ``os.environ``
only for the test that asks for ``gcs_bucket`` (and for ``GcsBucket.environment()``
blocks), so subprocesses of that test inherit them (they are also in
``GcsBucket.env``), and a training run of a later test still finds its metadata
server at the closed port conftest.py sets. ``blocked_requests()`` counts the requests
refused since the test (or block) started, so no other test's requests are counted.
"""

import contextlib
import dataclasses
import datetime
import http.client
import json
import logging
import os
import pathlib
import select
import ssl
import subprocess
import sys
import threading
import urllib.parse
import warnings
from http.server import BaseHTTPRequestHandler, HTTPServer, ThreadingHTTPServer

import pytest

BUCKET_NAME = "test-bucket"
FAKE_TOKEN = "emulator-token"

# The hosts TF's GCS filesystem calls; the proxy serves these and nothing else.
TLS_HOSTS = ("storage.googleapis.com", "www.googleapis.com")

# Headers that belong to one connection, not to the request; the proxy drops them
# (the body is passed on whole, so each side gets a fresh Content-Length).
_HOP_BY_HOP = frozenset(
    (
        "connection",
        "content-length",
        "expect",
        "keep-alive",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    )
)

_START_TIMEOUT_S = 60

# Tunables of TF's gs:// filesystem. TF reads them once, when ``import tensorflow``
# builds that filesystem, so pytest_configure below sets them before the test modules
# are imported; that works when conftest.py lists this plugin (or ``-p gcs_emulator``).
# By default TF caches stat results for 5 s, which hides changes that Beam makes, and
# retries a failed request 10 times with backoff: minutes for one emulator error.
TF_GCS_SETTINGS = {
    "GCS_STAT_CACHE_MAX_AGE": "0",
    "GCS_RETRY_CONFIG_MAX_RETRIES": "2",
}
_saved_tf_gcs_settings = {}


@dataclasses.dataclass(frozen=True)
class GcsBucket:
    """What the ``gcs_bucket`` fixture yields."""

    name: str
    env: dict  # the variables set in os.environ; pass them to subprocesses
    log_path: pathlib.Path  # the emulator's and the proxy's log
    log_offset: int = 0  # where this test's part of the log starts

    @property
    def url(self):
        return f"gs://{self.name}"

    def path(self, *parts):
        """``gs://bucket/part/part``."""
        return "/".join((self.url, *parts))

    def blocked_requests(self):
        """Requests the proxy refused since this test started: each one tried to leave the machine."""
        with open(self.log_path, "rb") as log:
            log.seek(self.log_offset)
            lines = log.read().decode("utf-8", "replace").splitlines()
        return [line for line in lines if "BLOCKED" in line]

    @contextlib.contextmanager
    def environment(self):
        """The emulator's variables in os.environ for the block (a wider-scoped fixture's upload);
        yields the bucket with its own log offset."""
        saved = _set_environ(self.env)
        try:
            yield dataclasses.replace(self, log_offset=self.log_path.stat().st_size)
        finally:
            _restore_environ(saved)


def pytest_configure(config):
    if "tensorflow" in sys.modules:
        warnings.warn(  # noqa: B028 - the warning names its cause; the caller's frame adds nothing
            pytest.PytestConfigWarning(
                "gcs_emulator was loaded after tensorflow was imported, so TF's gs:// "
                "stat cache and retries keep their defaults in this process; list "
                "the plugin in conftest.py: pytest_plugins = ['gcs_emulator']"
            )
        )
    _saved_tf_gcs_settings.update(_set_environ(TF_GCS_SETTINGS))


def pytest_unconfigure(config):
    _restore_environ(_saved_tf_gcs_settings)


def _set_environ(variables):
    """Set ``variables`` in os.environ; return what they replaced, for _restore_environ."""
    saved = {key: os.environ.get(key) for key in variables}
    os.environ.update(variables)
    return saved


def _restore_environ(saved):
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture
def gcs_bucket(gcs_server):
    """A bucket on the local GCS emulator, reachable from Beam and TensorFlow during this test."""
    with gcs_server.environment() as bucket:
        yield bucket


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory):
    """The emulator and proxy process, once per session; its variables are not set (see gcs_bucket)."""
    workdir = tmp_path_factory.mktemp("gcs_emulator")
    log_path = workdir / "server.log"
    with open(log_path, "w") as log:
        server = subprocess.Popen(
            [sys.executable, __file__, str(workdir), BUCKET_NAME],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
    try:
        ports = _wait_until_ready(server, log_path)
        yield GcsBucket(name=BUCKET_NAME, env=_client_env(workdir, **ports), log_path=log_path)
    finally:
        server.stdin.close()  # the child exits when its stdin closes
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        server.stdout.close()


def _wait_until_ready(server, log_path):
    """The child prints one JSON line with its ports once both servers listen."""
    readable, _, _ = select.select([server.stdout], [], [], _START_TIMEOUT_S)
    line = server.stdout.readline() if readable else ""
    if not line:
        server.kill()
        server.wait()
        raise RuntimeError(f"the GCS emulator did not start; its log ({log_path}):\n" + log_path.read_text())
    return json.loads(line)


def _client_env(workdir, emulator_port, proxy_port):
    credentials = workdir / "fake_adc.json"
    credentials.write_text(
        json.dumps(
            {
                "type": "authorized_user",
                "client_id": "emulator",
                "client_secret": "emulator",
                "refresh_token": "emulator",
                "token": FAKE_TOKEN,
                "expiry": "2999-01-01T00:00:00Z",
            }
        )
    )
    proxy = f"http://127.0.0.1:{proxy_port}"
    return {
        # Beam / google-cloud-storage: straight to the emulator.
        "STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{emulator_port}",
        "GOOGLE_APPLICATION_CREDENTIALS": str(credentials),
        "GOOGLE_CLOUD_PROJECT": "emulator-project",  # else google-auth warns: no project
        # TensorFlow: through the proxy, trusting only the throwaway CA.
        "HTTPS_PROXY": proxy,
        "https_proxy": proxy,
        "CURL_CA_BUNDLE": str(workdir / "ca.pem"),
        "GOOGLE_AUTH_TOKEN_FOR_TESTING": FAKE_TOKEN,
        "NO_GCE_CHECK": "true",
        **TF_GCS_SETTINGS,
        # Anything else that tries to leave the machine meets the proxy's 403.
        "HTTP_PROXY": proxy,
        "http_proxy": proxy,
        "GCE_METADATA_HOST": f"127.0.0.1:{proxy_port}",
        "GCE_METADATA_IP": f"127.0.0.1:{proxy_port}",
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }


# ---- The child process: emulator + proxy -------------------------------------


class _ProxyHandler(BaseHTTPRequestHandler):
    """Opens TLS tunnels to the GCS hosts; refuses everything else."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # else each answer waits ~40 ms for an ACK

    def do_CONNECT(self):
        host, _, port = self.path.rpartition(":")
        if host not in TLS_HOSTS or port != "443":
            self._refuse()
            return
        self.send_response_only(200, "Connection established")
        self.end_headers()
        tls = self.server.tls_context.wrap_socket(self.connection, server_side=True)
        with tls:
            _EmulatorForwarder(tls, self.client_address, self.server)
        self.close_connection = True

    def _refuse(self):
        logging.warning("BLOCKED %s %s", self.command, self.path)
        self.send_error(403, "this test proxy serves only the GCS hosts")

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _refuse

    def log_message(self, format, *args):
        logging.info(format, *args)


class _EmulatorForwarder(BaseHTTPRequestHandler):
    """Serves the HTTP requests inside one TLS tunnel by passing them to the emulator."""

    protocol_version = "HTTP/1.1"  # keep-alive, and "Expect: 100-continue" answered here

    def _forward(self):
        path, body = self.path, self._read_body()
        # Without the Host header, http.client sends the emulator's own address, from
        # which the emulator builds the links it returns. So mediaLink, which Beam
        # downloads from, points at the emulator even for objects that TF wrote.
        headers = {
            name: value
            for name, value in self.headers.items()
            if name.lower() not in _HOP_BY_HOP and name.lower() != "host"
        }
        if not body and "uploadType=media" in path:
            path, body, headers = _as_multipart_upload(path, headers)
        port = self.server.emulator_port
        emulator = http.client.HTTPConnection("127.0.0.1", port)
        try:
            emulator.request(self.command, path, body=body, headers=headers)
            response = emulator.getresponse()
            data = response.read()
        finally:
            emulator.close()
        logging.info(
            "%s https://%s%s -> %d",
            self.command,
            self.headers["Host"],
            self.path,
            response.status,
        )
        self.send_response_only(response.status, response.reason)
        for name, value in response.getheaders():
            if name.lower() in _HOP_BY_HOP:
                continue
            if name.lower() == "location":
                # An upload-session URL: keep TF's upload coming through this tunnel.
                value = value.replace(f"http://127.0.0.1:{port}", f"https://{self.headers['Host']}", 1)
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _read_body(self):
        if "chunked" not in self.headers.get("Transfer-Encoding", ""):
            return self.rfile.read(int(self.headers.get("Content-Length", 0)))
        # TF's libcurl sends upload data chunked.
        chunks = []
        while size := int(self.rfile.readline().split(b";")[0], 16):
            chunks.append(self.rfile.read(size))
            self.rfile.readline()  # the CRLF after each chunk
        while self.rfile.readline().strip():  # trailers, up to the blank line
            pass
        return b"".join(chunks)

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

    def log_message(self, format, *args):
        logging.info(format, *args)


def _as_multipart_upload(path, headers):
    """Rewrite an empty ``uploadType=media`` upload as the same, empty, multipart one.

    gcp-storage-emulator fails on an empty media upload, which is how TF makes a
    directory marker (``gs://bucket/ckpt/`` before a checkpoint); multipart works.
    """
    name = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query)["name"][0]
    boundary = "gcs-emulator-proxy"
    body = (
        f"--{boundary}\r\nContent-Type: application/json\r\n\r\n"
        + json.dumps({"name": name})
        + f"\r\n--{boundary}\r\nContent-Type: application/octet-stream\r\n\r\n"
        + f"\r\n--{boundary}--\r\n"
    ).encode()
    headers = {k: v for k, v in headers.items() if k.lower() != "content-type"}
    headers["Content-Type"] = f"multipart/related; boundary={boundary}"
    return path.replace("uploadType=media", "uploadType=multipart"), body, headers


def _write_certificates(workdir):
    """A throwaway CA (``ca.pem``) and a certificate for TLS_HOSTS signed by it."""
    # Only the child process needs these.
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def certificate(subject, issuer, public_key, signing_key, extensions):
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=2))
        )
        for extension, critical in extensions:
            builder = builder.add_extension(extension, critical=critical)
        return builder.sign(signing_key, hashes.SHA256())

    def name(common_name):
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = certificate(
        name("gcs-emulator test CA"),
        name("gcs-emulator test CA"),
        ca_key.public_key(),
        ca_key,
        [
            (x509.BasicConstraints(ca=True, path_length=0), True),
            (
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                True,
            ),
            (x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False),
        ],
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = certificate(
        name(TLS_HOSTS[0]),
        ca_cert.subject,
        key.public_key(),
        ca_key,
        [
            (x509.SubjectAlternativeName([x509.DNSName(h) for h in TLS_HOSTS]), False),
            (x509.BasicConstraints(ca=False, path_length=None), True),
            (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False),
            (
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                False,
            ),
        ],
    )
    pem = serialization.Encoding.PEM
    (workdir / "ca.pem").write_bytes(ca_cert.public_bytes(pem))
    (workdir / "proxy.pem").write_bytes(
        cert.public_bytes(pem)
        + key.private_bytes(
            pem,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


def _serve(workdir, bucket_name):
    """Run the emulator and the proxy until stdin closes: at the fixture's teardown,
    or when the test process dies."""
    from functools import partial

    from gcp_storage_emulator.handlers.buckets import create_bucket
    from gcp_storage_emulator.server import RequestHandler
    from gcp_storage_emulator.storage import Storage

    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    # The emulator warns about each batch answer it writes; nothing to act on.
    logging.getLogger("gcp_storage_emulator.server").addFilter(
        lambda record: "handled as string" not in record.getMessage()
    )
    _write_certificates(workdir)

    storage = Storage(use_memory_fs=True)
    create_bucket(bucket_name, storage)
    # Port 0: the kernel picks a free port, so parallel sessions cannot collide.
    # One request at a time, as gcp-storage-emulator's own server does.
    emulator = HTTPServer(("127.0.0.1", 0), partial(RequestHandler, storage))

    proxy = ThreadingHTTPServer(("127.0.0.1", 0), _ProxyHandler)
    proxy.daemon_threads = True
    proxy.emulator_port = emulator.server_port
    proxy.tls_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    proxy.tls_context.load_cert_chain(workdir / "proxy.pem")

    for server in (emulator, proxy):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    ports = {"emulator_port": emulator.server_port, "proxy_port": proxy.server_port}
    print(json.dumps(ports), flush=True)
    sys.stdin.read()  # the servers' threads end with the process


if __name__ == "__main__":
    _serve(pathlib.Path(sys.argv[1]), sys.argv[2])
