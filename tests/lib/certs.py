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

issue(name, subject, issuer, expired=False) makes a further client
certificate on demand (once per name), e.g. CN=dave/O=readers from client_ca,
or one whose validity ended in 2020 (openssl ca -startdate/-enddate: `req
-x509 -days` takes no past dates).
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


# `openssl ca` for a certificate with dates in the past (the [client] extensions)
CA_CONFIG = """\
[ca]
default_ca = testca
[testca]
database = %(db)s/index.txt
new_certs_dir = %(db)s
serial = %(db)s/serial
default_md = sha256
policy = anything
unique_subject = no
x509_extensions = client
[anything]
organizationName = optional
commonName = supplied
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
        self._issued = {}
        self._issue_lock = threading.Lock()

    def issue(self, name, subject, issuer, expired=False):
        """A client certificate for subject (e.g. "/O=readers/CN=dave") signed
        by issuer (an Entity); expired: valid 2020-01-01 to 2020-01-08 only.
        Made on first use; the same Entity for the same name afterwards."""
        with self._issue_lock:
            e = self._issued.get(name)
            if e is None:
                e = self._make_expired(name, subject, issuer) if expired else \
                    self._make(name, subject, "client", issuer)
                self._issued[name] = e
            return e

    def _make_expired(self, name, subject, issuer):
        e = Entity(self.dir, name, subject, secrets.randbits(63) | 1)
        db = tempfile.mkdtemp(prefix="ca-db-", dir=self.dir)
        open(os.path.join(db, "index.txt"), "w").close()
        with open(os.path.join(db, "serial"), "w") as f:
            f.write("%016x\n" % e.serial)  # an even number of hex digits
        cnf = os.path.join(db, "ca.cnf")
        with open(cnf, "w") as f:
            f.write(CONFIG + CA_CONFIG % {"db": db})
        csr = os.path.join(db, name + ".csr")
        env = dict(os.environ, OPENSSL_CONF=cnf)
        for argv in (["openssl", "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                      "-keyout", e.key, "-out", csr, "-config", cnf, "-subj", subject],
                     ["openssl", "ca", "-batch", "-config", cnf, "-cert", issuer.crt, "-keyfile", issuer.key,
                      "-in", csr, "-out", e.crt, "-notext", "-startdate", "20200101000000Z",
                      "-enddate", "20200108000000Z"]):
            r = subprocess.run(argv, capture_output=True, env=env)
            if r.returncode != 0:
                raise RuntimeError("%s failed (%d): %s" % (" ".join(argv), r.returncode, r.stderr.decode()))
        return e

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
