"""TLS and AUTH with the blocking client: nsqd with --tls-cert/--tls-key (and --tls-required),
and --auth-http-address for the secret.

    .venv/bin/python examples/tls_auth.py 127.0.0.1:4150 ca.pem SECRET
"""

import sys

from pynsqd.client import ClientOptions, Connection

address, ca_file, secret = sys.argv[1], sys.argv[2], sys.argv[3]
options = ClientOptions(
    tls=True,  # IDENTIFY tls_v1: the connection upgrades to TLS
    tls_ca_file=ca_file,  # the CA that signed nsqd's certificate (default: the system's)
    auth_secret=secret,  # AUTH, after IDENTIFY, when nsqd asks for it
)
with Connection(address, options).connect() as conn:
    conn.pub("secure", b"over TLS, authorised")
print("published over TLS with AUTH")
