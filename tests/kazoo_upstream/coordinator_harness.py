"""A pytest plugin for kazoo's own test suite (kazoo/tests from its sdist): the suite's harness
starts a Java ZooKeeper per server (`kazoo.testing.common.ManagedZooKeeper`); this plugin puts a
coordinator node in its place on the same ports, so that the unchanged suite runs against a
three-node coordinator cluster.

What the harness configures ZooKeeper with is mapped onto the coordinator's flags: the client
port, the secure client port with the server certificate the harness generated, the peers'
addresses (their quorum ports become Raft ports), and the `super` digest it sets as a system
property. Loaded with `-p coordinator_harness`; `MERGESTREAM_COORDINATOR_BIN` names the binary.
"""

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import kazoo.testing.common as common
from OpenSSL import crypto

COORDINATOR_BIN = os.environ["MERGESTREAM_COORDINATOR_BIN"]
# Shared by the three nodes of the cluster, as every member must be.
CLUSTER_SECRET = "kazoo-suite-cluster-secret-0123456789\n"
SUPER_DIGEST_PROPERTY = "-Dzookeeper.DigestAuthenticationProvider.superDigest="


def v3_server_certificate(ssl_configuration):
    """The harness's server certificate as X.509 v3, signed by the harness's CA: it makes an
    X.509 v1 certificate (no version set), which Java accepts and rustls, following RFC 5280's
    rules for end-entity certificates, does not. Same subject, key and issuer; clients verify
    it against the same CA."""
    original = ssl_configuration["server_cert"]
    cert = crypto.X509()
    cert.set_version(2)
    cert.set_serial_number(original.get_serial_number())
    cert.set_subject(original.get_subject())
    cert.set_issuer(ssl_configuration["ca_cert"].get_subject())
    cert.set_pubkey(ssl_configuration["server_key"])
    cert.gmtime_adj_notBefore(0)
    cert.gmtime_adj_notAfter(24 * 60 * 60)
    cert.add_extensions([crypto.X509Extension(b"subjectAltName", False, b"DNS:localhost,IP:127.0.0.1")])
    cert.sign(ssl_configuration["ca_key"], "sha256")
    return (crypto.dump_certificate(crypto.FILETYPE_PEM, cert),
            crypto.dump_privatekey(crypto.FILETYPE_PEM, ssl_configuration["server_key"]))


class ManagedCoordinator:
    """The interface of `ManagedZooKeeper` that the harness and the tests use."""

    def __init__(self, software_path, server_info, peers=(), classpath=None, configuration_entries=(),
                 java_system_properties=(), jaas_config=None, ssl_configuration=None):
        self.server_info = server_info
        self.peers = peers
        self.host = "127.0.0.1"
        self.working_path = tempfile.mkdtemp(prefix="kazoo-coordinator-")
        self.ssl_configuration = ssl_configuration or {}
        self.super_digest = next((p[len(SUPER_DIGEST_PROPERTY):] for p in java_system_properties
                                  if p.startswith(SUPER_DIGEST_PROPERTY)), None)
        self.process = None

    @property
    def running(self):
        return self.process is not None

    @property
    def data_path(self):
        return os.path.join(self.working_path, "data")

    def _write(self, name, content):
        path = os.path.join(self.working_path, name)
        with open(path, "wb") as f:
            f.write(content)
        return path

    def run(self):
        if self.running:
            return
        # A destroyed server is run again by the next test class, as the harness does.
        os.makedirs(self.working_path, exist_ok=True)
        info = self.server_info
        args = [COORDINATOR_BIN, "serve", "--node-id", str(info.server_id),
                "--client-addr", f"{self.host}:{info.client_port}",
                "--raft-addr", f"{self.host}:{info.leader_port}",
                "--data-dir", self.data_path]
        for peer in self.peers:
            args += ["--peer", f"{peer.server_id}={self.host}:{peer.leader_port}"]
        if self.peers:
            args += ["--cluster-secret-file", self._write("cluster-secret", CLUSTER_SECRET.encode())]
        if "server_cert" in self.ssl_configuration:
            cert, key = v3_server_certificate(self.ssl_configuration)
            args += ["--secure-client-addr", f"{self.host}:{info.secure_client_port}",
                     "--tls-cert", self._write("server.pem", cert), "--tls-key", self._write("server.key", key)]
        if self.super_digest:
            args += ["--super-digest", self.super_digest]
        with open(os.path.join(self.working_path, "coordinator.log"), "ab") as log:
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)

    @property
    def address(self):
        return f"{self.host}:{self.client_port}"

    @property
    def secure_address(self):
        return f"{self.host}:{self.secure_client_port}"

    @property
    def client_port(self):
        return self.server_info.client_port

    @property
    def secure_client_port(self):
        return self.server_info.secure_client_port

    def reset(self):
        self.stop()
        shutil.rmtree(self.data_path, True)

    def stop(self):
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None

    def destroy(self):
        self.stop()
        shutil.rmtree(self.working_path, True)

    def get_logs(self, num_lines=100):
        path = Path(self.working_path, "coordinator.log")
        if not path.exists():
            return []
        return path.read_text(errors="replace").splitlines(keepends=True)[-num_lines:]


common.ManagedZooKeeper = ManagedCoordinator
