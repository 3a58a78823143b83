"""`flashserve run`'s flags: bad values are refused before anything starts, naming the flag (or the environment
variable it was read from) and the form it wants; no traceback."""

from __future__ import annotations

import pytest
from flashserve.controller.main import _parser, main, split_address


@pytest.mark.parametrize("argv, words", [
    (["--resync-seconds", "-5"], "--resync-seconds: '-5' is not a positive float"),
    (["--resync-seconds", "nan"], "--resync-seconds: 'nan' is not a positive float"),
    (["--watch-timeout", "abc"], "--watch-timeout: 'abc' is not a positive int"),
    (["--metrics-address", "bogus"], "is not host:port with a port of 0-65535"),
    (["--metrics-address", "127.0.0.1:99999"], "is not host:port with a port of 0-65535"),
    (["--metrics-address", ":::8082"], "write an IPv6 address in brackets"),
    (["--liveness", "notaurl"], "is not http://host[:port]/path"),
])  # fmt: skip
def test_a_bad_flag_is_refused_naming_it(argv, words, capsys):
    with pytest.raises(SystemExit) as exit_:
        _parser().parse_args(argv)
    assert exit_.value.code == 2 and words in capsys.readouterr().err


def test_a_bad_value_from_the_environment_names_the_variable_and_help_still_works(monkeypatch, capsys):
    monkeypatch.setenv("FLASHSERVE_WATCH_TIMEOUT", "abc")
    with pytest.raises(SystemExit) as exit_:
        _parser().parse_args([])
    assert exit_.value.code == 2 and "$FLASHSERVE_WATCH_TIMEOUT" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        _parser().parse_args(["--help"])
    assert exit_.value.code == 0


def test_defaults_and_ipv6_addresses_parse():
    args = _parser().parse_args(["--metrics-address", "[::]:8082", "--liveness", "http://[::]:8081/healthz"])
    assert _parser().parse_args(["--liveness", "http://0.0.0.0/healthz"]).liveness, "no port: kopf's default, 80"
    assert (args.resync_seconds, args.watch_timeout) == (30.0, 300)
    assert split_address(args.metrics_address) == ("::", 8082)
    assert split_address("0.0.0.0:8082") == ("0.0.0.0", 8082) and split_address(":8082") == ("", 8082)


def test_a_missing_kubeconfig_or_a_bad_certificate_stops_before_start(monkeypatch, tmp_path, capsys):
    assert main(["--kubeconfig", "/nonexistent/kubeconfig"]) == 2
    assert "error: --kubeconfig /nonexistent/kubeconfig: no such readable file" in capsys.readouterr().err
    assert main(["--metrics-cert-file", "/nonexistent/tls.crt", "--metrics-key-file", "/nonexistent/tls.key"]) == 2
    assert "--metrics-cert-file /nonexistent/tls.crt: no such readable file" in capsys.readouterr().err
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    assert main(["--no-leader-elect"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot load a kubeconfig from") and str(tmp_path / "missing") in err
    assert "Traceback" not in err
    cert = tmp_path / "tls.crt"
    cert.write_text("not a certificate")
    assert main(["--metrics-key-file", str(cert)]) == 2
    assert "--metrics-key-file needs --metrics-cert-file" in capsys.readouterr().err
    assert main(["--metrics-cert-file", str(cert)]) == 2, "a certificate file may hold its key, but must be PEM"
    assert "not a PEM certificate and its key" in capsys.readouterr().err
