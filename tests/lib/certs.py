"""Test certificates for kwc's TLS front end, made with the openssl command
line (EC P-256 keys: a whole set takes a few tens of milliseconds).

pki() makes one set per test run (per process) into a temp dir, removed at
exit, and returns the same object on every call. Tests that change files
(certificate reload) copy them into their own directory first.

  ca            the CA kwc's serving certificates chain to (what clients trust)
  server        CN=kwc-server, subjectAltName IP:127.0.0.1, IP:::1, DNS:localhost
  server2       the same names, another key, serial and CN (for reload tests)
  client_ca     the CA for --client-ca-file
  client        CN=alice, O=devs, signed by client_ca
  other_ca      a CA nobody trusts
  other_client  CN=mallory, signed by other_ca

Each entity has .crt and .key paths (a CA's key signs only) and .serial.
"""
import atexit
import os
import secrets
import shutil
import subprocess
import tempfile
import threading

CONFIG = """\
[req]
distinguished_name = dn
[dn]
[ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
[server]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = serverAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
subjectAltName = IP:127.0.0.1,IP:::1,DNS:localhost
[client]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
"""


class Entity:
    def __init__(self, d, name, subject, serial):
        self.name = name
        self.subject = subject
        self.serial = serial
        self.crt = os.path.join(d, name + ".crt")
        self.key = os.path.join(d, name + ".key")

    def pem(self):
        with open(self.crt, "rb") as f:
            return f.read()

    def der(self):
        """The certificate as a server presents it (ssl getpeercert(binary_form=True))."""
        import ssl
        return ssl.PEM_cert_to_DER_cert(self.pem().decode())


class PKI:
    def __init__(self, d):
        self.dir = d
        cnf = os.path.join(d, "openssl.cnf")
        with open(cnf, "w") as f:
            f.write(CONFIG)
        self._cnf = cnf
        self.ca = self._make("ca", "/CN=kwc-test-ca", "ca")
        self.server = self._make("server", "/CN=kwc-server", "server", self.ca)
        self.server2 = self._make("server2", "/CN=kwc-server-2", "server", self.ca)
        self.client_ca = self._make("client-ca", "/CN=kwc-test-client-ca", "ca")
        self.client = self._make("client", "/O=devs/CN=alice", "client", self.client_ca)
        self.other_ca = self._make("other-ca", "/CN=unrelated-ca", "ca")
        self.other_client = self._make("other-client", "/O=devs/CN=mallory", "client", self.other_ca)

    def _make(self, name, subject, ext, issuer=None):
        e = Entity(self.dir, name, subject, secrets.randbits(63) | 1)
        argv = ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-keyout", e.key, "-out", e.crt, "-config", self._cnf, "-extensions", ext, "-subj", subject,
                "-days", "7", "-set_serial", str(e.serial)]
        if issuer:
            argv += ["-CA", issuer.crt, "-CAkey", issuer.key]
        r = subprocess.run(argv, capture_output=True, env=dict(os.environ, OPENSSL_CONF=self._cnf))
        if r.returncode != 0:
            raise RuntimeError("%s failed (%d): %s" % (" ".join(argv), r.returncode, r.stderr.decode()))
        return e


_lock = threading.Lock()
_pki = None


def pki():
    """The test run's certificates (made on first use)."""
    global _pki
    with _lock:
        if _pki is None:
            d = tempfile.mkdtemp(prefix="kwc-pki-")
            atexit.register(shutil.rmtree, d, True)
            _pki = PKI(d)
        return _pki


if __name__ == "__main__":
    p = pki()
    for n in ("ca", "server", "server2", "client_ca", "client", "other_ca", "other_client"):
        e = getattr(p, n)
        print("%-13s %s  serial %d  %s" % (n, e.crt, e.serial, e.subject))
