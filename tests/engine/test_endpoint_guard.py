"""An endpoint benchmark reaches only what the node's operator allows: the endpoint's host is resolved and every
address checked (loopback, link-local, metadata services and the node's broker refused, however the address is
written), the client connects to the checked addresses only, follows no redirect, and reports an HTTP error as its
status and size: nothing a reply says reaches the result. Real servers on real sockets; nothing mocked."""

from __future__ import annotations

import datetime
import socket
import ssl
import threading

import pytest

from workers.engine.serving.client import Endpoint, greedy, run_requests
from workers.engine.serving.endpoint_bench import EndpointBenchFailed, check_base_url
from workers.engine.serving.endpoint_guard import AllowList, EndpointNotAllowed, EndpointPolicy, node_environment
from workers.engine.serving.stage import endpoint_bench
from workers.engine.sweep.workload import Workload

from .fake_endpoint import FakeEndpoint

SECRET = "ami-secret-role-credentials-7f3a"
# A node whose broker is a private address, as in a cluster: that host:port is refused, its other ports are not.
NODE = EndpointPolicy.from_environment(node_environment("", "redis://:password@10.9.8.7:6379/0"))
WORKLOAD = {"requests": 3, "prompt_len": 4, "output_len": 3, "warmup_requests": 0}


def bench(base_url: str, policy: EndpointPolicy, concurrency=(1,)) -> dict:
    return endpoint_bench({"config": {"vocab_size": 1000}, "base_url": base_url, "served_model": "m",
                           "api_key": "sk-test", "concurrency": list(concurrency), "workload": WORKLOAD},
                          lambda fraction, message: None, policy)


def allowing(text: str) -> EndpointPolicy:
    return EndpointPolicy(AllowList.parse(text))


@pytest.mark.parametrize("url, reason", [
    ("http://169.254.169.254/latest/meta-data", "metadata"),
    ("http://metadata.google.internal/computeMetadata/v1", "metadata"),
    ("http://[fd00:ec2::254]/", "metadata"),
    ("http://100.100.100.200/", "metadata"),
    ("http://[64:ff9b::a9fe:a9fe]/", "metadata"),  # NAT64's spelling of 169.254.169.254
    ("http://10.9.8.7:6379", "this node's broker"),
    ("http://[::1]:8000", "loopback"),
    ("http://localhost:8000", "loopback"),
    ("http://127.0.0.1:8000", "loopback"),
    ("http://127.45.6.7:8000", "loopback"),
    ("http://0x7f000001:8000", "loopback"),
    ("http://2130706433:8000", "loopback"),
    ("http://0177.0.0.1:8000", "loopback"),
    ("http://127.1:8000", "loopback"),
    ("http://[::ffff:127.0.0.1]:8000", "loopback"),
    ("http://[2002:7f00:1::]:8000", "loopback"),  # 6to4 around 127.0.0.1
    ("http://169.254.1.1:8000", "link-local"),
    ("http://[fe80::1]:8000", "link-local"),
    ("http://0.0.0.0:8000", "unspecified"),
    ("http://0:8000", "unspecified"),
    ("http://[::]:8000", "unspecified"),
    ("http://224.0.0.1:8000", "multicast"),
    ("http://255.255.255.255:8000", "reserved"),
])
def test_special_addresses_are_refused_however_written(url, reason):
    with pytest.raises(EndpointNotAllowed, match=reason):
        NODE.pin(url)


@pytest.mark.parametrize("url, address", [
    ("http://10.0.0.7:8000", "10.0.0.7"),
    ("http://172.16.4.2:8000", "172.16.4.2"),
    ("http://192.168.1.20:8000", "192.168.1.20"),
    ("http://100.64.0.9:8000", "100.64.0.9"),  # shared address space (Tailscale, carrier-grade NAT)
    ("http://[fd12:3456::7]:8000", "fd12:3456::7"),
    ("http://10.9.8.7:8000", "10.9.8.7"),  # the broker's host at another port
    ("http://[::ffff:10.0.0.7]:8000", "::ffff:a00:7"),  # judged as the IPv4 address it carries
    ("https://8.8.8.8", "8.8.8.8"),
])
def test_private_and_public_addresses_are_where_endpoints_live(url, address):
    assert NODE.pin(url) == (address,)


def test_a_listed_loopback_is_reached_but_never_the_broker_beside_it():
    node = EndpointPolicy.from_environment(node_environment("127.0.0.1, localhost", "redis://:pw@localhost:6379/0"))
    assert node.pin("http://127.0.0.1:8000") == ("127.0.0.1",)
    assert node.pin("http://0x7f000001:8000") == ("127.0.0.1",)  # listed by address, however written
    for url in ("http://127.0.0.1:6379", "http://localhost:6379", "http://[::ffff:127.0.0.1]:6379"):
        with pytest.raises(EndpointNotAllowed, match="this node's broker: refused$"):
            node.pin(url)
    with pytest.raises(EndpointNotAllowed, match="loopback"):
        node.pin("http://[::1]:8000")  # ::1 is not listed


def test_a_metadata_address_is_reached_only_when_listed_as_itself():
    with pytest.raises(EndpointNotAllowed, match="lists that one address"):
        allowing("169.254.0.0/16").pin("http://169.254.169.254/")
    assert allowing("169.254.0.0/16").pin("http://169.254.1.1/") == ("169.254.1.1",)
    assert allowing("169.254.169.254").pin("http://169.254.169.254/") == ("169.254.169.254",)


def test_the_allow_list_takes_hosts_and_cidrs_and_refuses_anything_else():
    listed = AllowList.parse("10.0.0.0/8 , gpu-node-3.internal. [::1]\n127.0.0.1")
    assert {str(network) for network in listed.networks} == {"10.0.0.0/8", "::1/128", "127.0.0.1/32"}
    assert listed.hosts == {"gpu-node-3.internal"}
    for bad in ("http://x", "host;rm", "a b/c"):
        with pytest.raises(ValueError, match="neither a host name nor an address"):
            node_environment(bad, "redis://localhost:6379/0")


@pytest.mark.parametrize("url, message", [
    ("http://169.254.169.254:80", "metadata service"),
    ("http://0xa9fea9fe/", "metadata service"),
    ("http://metadata.google.internal", "metadata service"),
    ("http://[fd00:ec2::254]:80", "metadata service"),
    ("http://user:pass@gpu-node-3:8000", "without credentials"),
    ("http://a@127.0.0.1:80@gpu-node-3/", "without credentials"),
    ("http://gpu-node-3\\@127.0.0.1/", "http(s) base URL"),
    ("gopher://gpu-node-3:70", "http(s) base URL"),
    ("http://gpu-node-3:port", "http(s) base URL"),
])
def test_the_control_planes_check_refuses_what_no_node_should_reach_without_a_lookup(url, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_base_url(url)


def test_an_allow_listed_loopback_endpoint_is_benchmarked():
    with FakeEndpoint() as server:
        result = bench(server.base_url, allowing("127.0.0.1"), concurrency=(1, 2))
    assert [trial["status"] for trial in result["trials"]] == ["ok", "ok"]
    assert len(server.requests) == 2 * WORKLOAD["requests"]
    assert {request["host"] for request in server.requests} == {f"127.0.0.1:{server.port}"}


def test_an_unlisted_loopback_endpoint_is_refused_before_any_request():
    with FakeEndpoint() as server:
        for url in (server.base_url, f"http://localhost:{server.port}", f"http://0x7f000001:{server.port}"):
            with pytest.raises(EndpointNotAllowed, match="loopback address: refused"):
                bench(url, allowing("10.0.0.0/8"))
    assert server.requests == []


def test_the_client_connects_to_the_checked_address_and_never_resolves_the_host_again():
    """DNS rebinding: what the host resolves to after the check does not matter. The name here resolves to nothing
    at all, yet every request reaches the pinned address, still naming the host in its Host header."""
    with FakeEndpoint() as server:
        endpoint = Endpoint(f"http://rebound.invalid:{server.port}", "m", addresses=("127.0.0.1",))
        run = run_requests(endpoint, Workload.from_dict(WORKLOAD).measured_requests(1000), in_flight=2,
                           timeout_s=30)
    assert [record.error for record in run.records] == [None] * WORKLOAD["requests"]
    assert {request["host"] for request in server.requests} == {f"rebound.invalid:{server.port}"}


def _self_signed(tmp_path, name: str):
    pytest.importorskip("cryptography")
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
                   .public_key(key.public_key()).serial_number(1).not_valid_before(now)
                   .not_valid_after(now + datetime.timedelta(hours=1))
                   .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
                   .sign(key, hashes.SHA256()))
    (tmp_path / "cert.pem").write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                         serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))
    return tmp_path / "cert.pem", tmp_path / "key.pem"


def test_https_to_a_pinned_address_names_the_endpoints_host_in_its_tls_handshake(tmp_path):
    """SNI and the certificate check are for the URL's host, not the address: the TLS server sees the name, and
    the client refuses a certificate it does not trust (this one is self-signed) rather than going on."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*_self_signed(tmp_path, "endpoint.test"))
    named = []
    context.sni_callback = lambda connection, name, ctx: named.append(name)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve():
        connection, _ = listener.accept()
        try:
            with context.wrap_socket(connection, server_side=True):
                pass
        except (ssl.SSLError, OSError):
            pass  # the client hangs up on the untrusted certificate

    threading.Thread(target=serve, daemon=True).start()
    endpoint = Endpoint(f"https://endpoint.test:{port}", "m", addresses=("127.0.0.1",))
    try:
        run = run_requests(endpoint, Workload.from_dict({**WORKLOAD, "requests": 1}).measured_requests(1000),
                           timeout_s=30)
    finally:
        listener.close()
    assert named == ["endpoint.test"]
    assert "Certificate" in run.records[0].error, run.records[0].error


def test_a_redirect_is_an_error_and_never_followed():
    with FakeEndpoint() as target, FakeEndpoint(reply="redirect", location=f"{target.base_url}/v1/completions") as \
            redirecting:
        with pytest.raises(EndpointBenchFailed, match="HTTP 307, a redirect, not followed"):
            bench(redirecting.base_url, allowing("127.0.0.1"))
        with pytest.raises(RuntimeError, match="HTTP 307, a redirect, not followed"):
            greedy(Endpoint(redirecting.base_url, "m"), [[1, 2]], 2)
    assert redirecting.requests and target.requests == []


def test_an_http_error_is_its_status_and_size_never_its_body():
    body = f'{{"AccessKeyId": "{SECRET}"}}'.encode()
    with FakeEndpoint(reply="error", status=403, body=body) as server:
        with pytest.raises(EndpointBenchFailed) as failed:
            bench(server.base_url, allowing("127.0.0.1"))
        with pytest.raises(RuntimeError) as greedy_failed:
            greedy(Endpoint(server.base_url, "m"), [[1, 2]], 2)
    for error in (str(failed.value), str(greedy_failed.value)):
        assert f"HTTP 403 ({len(body)} bytes of body, not shown)" in error and SECRET not in error


def test_a_service_that_does_not_speak_http_is_not_quoted():
    """A Redis or SSH port answers with a banner; aiohttp's own error quotes the bad status line."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve():
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            with connection:
                connection.recv(65536)
                connection.sendall(f"-ERR {SECRET}\r\nSSH-2.0-{SECRET}\r\n".encode())

    threading.Thread(target=serve, daemon=True).start()
    try:
        with pytest.raises(EndpointBenchFailed) as failed:
            bench(f"http://127.0.0.1:{port}", allowing("127.0.0.1"))
    finally:
        listener.close()
    assert "ClientResponseError: status 400 (the reply is not shown)" in str(failed.value)
    assert SECRET not in str(failed.value)
