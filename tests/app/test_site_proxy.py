"""The site key ``proxy``: checked, written by ``fedmed site init --proxy``, passed by
``fedmed site start``, and turned into the SuperNode's environment (httpx's own
proxy choice is checked on that environment). The real proxy and network
namespace are in tests/integration/test_deployment_proxy.py."""

from __future__ import annotations

import io
import tomllib

import httpx
import pytest

from app.site_runtime.site_proxy import LOOPBACK_NO_PROXY, check_proxy, proxy_env
from app.tooling.errors import FlowerProcessError
from app.tooling.site_init import init_site, start_argv
from strategies.wire.errors import ConfigError


@pytest.mark.parametrize("proxy", ["http://proxy.hospital.example:3128",
                                   "https://user:secret@10.0.0.5:8443/"])
def test_good_proxies_are_kept(proxy):
    assert check_proxy(proxy) == proxy


@pytest.mark.parametrize("proxy, rule", [
    ("socks5://proxy:1080", "scheme must be http:// or https://"),
    ("proxy.hospital.example:3128", "scheme must be http:// or https://"),
    ("http://proxy.hospital.example", "give the host and the port"),
    ("http://proxy:99999", "not a URL"),
    ("http://proxy:3128/path", "no path, query or fragment"),
])
def test_bad_proxies_name_the_key_and_rule(proxy, rule):
    with pytest.raises(FlowerProcessError, match=rule) as error:
        check_proxy(proxy)
    assert str(error.value).startswith(f"proxy {proxy!r}")


def test_the_environment_sends_https_through_the_proxy_and_loopback_http_direct(monkeypatch):
    env = proxy_env("http://proxy.hospital.example:3128")
    monkeypatch.delenv("ALL_PROXY", raising=False)
    monkeypatch.delenv("all_proxy", raising=False)
    monkeypatch.setenv("NO_PROXY", "10.0.0.0/8,.example.org")  # replaced, not merged
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert env["NO_PROXY"] == env["no_proxy"] == LOOPBACK_NO_PROXY
    # httpx (Flower's Fleet transport) reads the environment as the SuperNode's would.
    with httpx.Client() as client:
        def proxied(url: str) -> bool:
            transport = client._transport_for_url(httpx.URL(url))  # noqa: SLF001
            return transport is not client._transport  # noqa: SLF001
        assert proxied("https://superlink.example.org:9092/v1/fleet/pull-messages")
        assert proxied("https://127.0.0.1:9092/")  # even a loopback SuperLink
        assert not proxied("http://127.0.0.1:9094/")  # the node's own runtime API


def test_site_init_writes_the_key_and_site_start_passes_it(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    home = init_site(tmp_path / "site", "hospital-a", data, "fl.example.org:9092",
                     out=io.StringIO(), proxy="http://proxy.hospital.example:3128")
    settings = tomllib.loads(home.settings.read_text())
    assert settings["proxy"] == "http://proxy.hospital.example:3128"
    argv = start_argv(home.root, [])
    assert argv[argv.index("--proxy") + 1] == "http://proxy.hospital.example:3128"
    # an option on the command line wins over the file
    argv = start_argv(home.root, ["--proxy", "http://other:8080"])
    assert argv.count("--proxy") == 1 and argv[-1] == "http://other:8080"


def test_site_init_refuses_a_bad_proxy_before_writing_anything(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    with pytest.raises(ConfigError, match=r"--proxy: proxy 'proxy:3128'"):
        init_site(tmp_path / "site", "hospital-a", data, "fl.example.org:9092",
                  out=io.StringIO(), proxy="proxy:3128")
    assert not (tmp_path / "site").exists()
