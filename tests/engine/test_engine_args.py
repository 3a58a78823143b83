"""Reading the vLLM command line the operator renders, as vLLM 0.33 would."""

from __future__ import annotations

import pytest
from flashserve_testbed.engine.args import ArgsError, check_host, parse
from flashserve_testbed.engine.cli import main, vllm_main
from flashserve_testbed.engine.stats import Histogram, one_two_five

MODEL = "deepseek-ai/DeepSeek-V4.1-Flash"


def test_operator_style_command_line():
    a = parse([
        MODEL, "--served-model-name", "dsv4", "flash", "--port", "8000", "--tensor-parallel-size", "1",
        "--data-parallel-size", "4", "--enable-expert-parallel", "--all2all-backend", "deepep_low_latency",
        "--enable-eplb", "--eplb-config", '{"num_redundant_experts":32,"step_interval":3000,"window_size":1000}',
        "--enable-dbo", "--dbo-decode-token-threshold", "32", "--enable-prefix-caching",
        "--attention-backend", "FLASHINFER_MLA", "--kv-cache-dtype", "fp8", "--max-model-len", "131072",
        "--gpu-memory-utilization", "0.92", "--max-num-seqs", "256", "--max-num-batched-tokens", "8192",
        "--speculative-config", '{"method":"dspark","num_speculative_tokens":2}',
        "--compilation-config", '{"cudagraph_mode":"FULL_DECODE_ONLY"}', "--async-scheduling",
        "--custom-histogram-buckets", '{"inter_token_latency":[0.005,0.01,0.02]}',
    ])
    assert a.model == MODEL and a.served_model_names == ["dsv4", "flash"] and a.model_name == "dsv4"
    assert (a.max_num_seqs, a.max_num_batched_tokens, a.max_model_len) == (256, 8192, 131072)
    assert a.num_speculative_tokens == 2 and a.enable_prefix_caching
    assert a.engine_ranks == [0, 1, 2, 3]
    assert a.custom_buckets == {"inter_token_latency": (0.005, 0.01, 0.02)}
    assert {"--all2all-backend", "--enable-eplb", "--enable-dbo", "--async-scheduling"} <= set(a.ignored)
    assert a.host == "127.0.0.1"


@pytest.mark.parametrize(
    "argv, ranks",
    [
        ([], [0]),
        (["-dp", "4"], [0, 1, 2, 3]),
        # multi-node, hybrid LB inferred from a non-zero start rank: this node's ranks only
        (["-dp", "8", "-dpl", "4", "-dpr", "4"], [4, 5, 6, 7]),
        (["-dp", "8", "-dpl", "4", "-dpr", "0", "--data-parallel-hybrid-lb"], [0, 1, 2, 3]),
        # internal LB on the leader of a multi-node group fronts every rank
        (["-dp", "8", "-dpl", "4"], list(range(8))),
        # one local rank with hybrid LB is external LB
        (["-dp", "4", "-dpl", "1", "-dpr", "2"], [2]),
        (["--data-parallel-size=2", "--data-parallel-size-local=2"], [0, 1]),
    ],
)
def test_engine_ranks_follow_vllm(argv, ranks):
    assert parse([MODEL, *argv]).engine_ranks == ranks


def test_flag_spellings():
    a = parse([MODEL, "--max_num_seqs=12", "--no-enable-prefix-caching",
               "--speculative-config.num_speculative_tokens", "3", "--max-model-len", "32K", "-tp", "1"])
    assert a.max_num_seqs == 12 and not a.enable_prefix_caching and a.num_speculative_tokens == 3
    assert a.max_model_len == 32768
    assert parse([MODEL, "--max-model-len", "32k"]).max_model_len == 32000
    assert parse([MODEL, "--max-model-len", "auto"]).max_model_len is None


def test_repeated_served_model_name_keeps_the_last_like_argparse():
    a = parse([MODEL, "--served-model-name", "a", "--served-model-name", "b"])
    assert a.served_model_names == ["b"]
    assert any("more than once" in w for w in a.warnings)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--enable-magic"], "unrecognized arguments: --enable-magic"),
        (["--max-num-seqs", "lots"], "invalid int value"),
        (["--all2all-backend", "telepathy"], "invalid choice"),  # vLLM 0.33 does list pplx
        (["--kv-cache-dtype", "int3"], "invalid choice"),
        (["--compilation-config", '{"cudagraph_mode":"SOMETIMES"}'], "cudagraph_mode"),
        (["--speculative-config", "mtp"], "invalid JSON"),
        (["--speculative-config", '{"method":"mtp"}'], "use speculative method 'dspark'"),
        (["--speculative-config", '{"method":"dspark","num_speculative_tokens":0}'], "positive integer"),
        (["--custom-histogram-buckets", '{"inter_token_latency":[0.02,0.01]}'], "strictly increasing"),
        (["--custom-histogram-buckets", '{"itl":[0.01]}'], "unknown bucket family"),
        (["--custom-histogram-buckets", '{"inter_token_latency":[-1]}'], "positive"),
        (["-dp", "2", "-dpl", "4"], "exceeds"),
        (["--data-parallel-hybrid-lb", "--data-parallel-external-lb"], "cannot be used together"),
        (["--gpu-memory-utilization", "1.5"], "(0, 1]"),
        (["--enable-expert-parallel=yes"], "ignored explicit argument"),
        (["extra-positional"], "unrecognized arguments: extra-positional"),
    ],
)
def test_refused_command_lines(argv, message):
    with pytest.raises(ArgsError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        parse([MODEL, *argv])


def test_cli_exit_codes(capsys):
    assert main(["serve", MODEL, "--frobnicate"]) == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --frobnicate" in err
    assert vllm_main(["serve", MODEL, "--bogus", "1"]) == 2
    assert vllm_main(["chat"]) == 2
    assert vllm_main(["--version"]) == 0
    assert main(["--help"]) == 0
    assert main(["bench"]) == 2


def test_host_is_loopback_unless_allowed():
    assert check_host("0.0.0.0", allow_any=False) == "127.0.0.1"
    assert check_host("10.1.2.3", allow_any=False) == "127.0.0.1"
    assert check_host("127.0.0.2", allow_any=False) == "127.0.0.2"
    assert check_host("::1", allow_any=False) == "::1"
    assert check_host("0.0.0.0", allow_any=True) == "0.0.0.0"


def test_histogram_progression_matches_one_by_one_observations():
    bounds = (0.01, 0.025, 0.05, 0.075, 0.1)
    bulk, single = Histogram(bounds), Histogram(bounds)
    bulk.observe_progression(0.008, 0.0013, 70, times=3)
    for j in range(70):
        single.observe(0.008 + 0.0013 * j, 3)
    assert bulk.counts == single.counts
    assert bulk.total == pytest.approx(single.total) and bulk.n == single.n == 210


def test_request_token_buckets_are_one_two_five_up_to_max_model_len():
    assert one_two_five(131072) == (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)


# The mock's own checks of values vLLM validates after parsing, which the table's sample values do not meet.
_SAMPLE_REFUSED_BY_MOCK = {"attention_backend", "kv_cache_dtype", "data_parallel_size_local", "data_parallel_start_rank",
                           "data_parallel_hybrid_lb", "help"}  # fmt: skip


def test_every_option_string_of_the_table_is_accepted_in_each_spelling():
    from flashserve.facts import vllm_flags

    checked = 0
    for option in vllm_flags.OPTIONS:
        if option.dest in _SAMPLE_REFUSED_BY_MOCK or option.dest == "config":
            continue
        for s in vllm_flags.spellings(option):
            if s.form == "dotted":
                continue
            argv = [MODEL, *s.argv] if option.dest != "model" else list(s.argv)
            if s.vllm == "sets":
                parse(argv)
                checked += 1
            else:
                with pytest.raises(ArgsError):
                    parse(argv)
    assert checked > 5000


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--max-num", "3"], "ambiguous option"),
        (["-t=2"], "unrecognized arguments: -t=2"),  # argparse matches a single-dash prefix with its `=value`
        (["--tensor-parallel-size.x", "1"], "invalid int value"),
        (["-O"], "unrecognized arguments"),
    ],
)
def test_spellings_vllm_refuses_are_refused(argv, message):
    with pytest.raises(ArgsError, match=message):
        parse([MODEL, *argv])


def test_vllm_spellings_of_the_table():
    a = parse([MODEL, "-t", "1", "-dpl=1", "--max-num-se", "7", "-O3", "--disable-prefix-caching",
               "-sc.num_speculative_tokens=2", "--model_impl", "auto"])
    assert a.max_num_seqs == 7 and not a.enable_prefix_caching and a.num_speculative_tokens == 2
    assert a.raw["optimization_level"] == "3" and "--model-impl" in a.ignored
    # sub-keys replace a plain JSON value rather than merge with it, as FlexibleArgumentParser appends them
    b = parse([MODEL, "--speculative-config", '{"method":"dspark","num_speculative_tokens":3}',
               "--speculative-config.method", "dspark"])
    assert b.num_speculative_tokens == 1
    assert parse(["--port", "9000", "--model", MODEL]).model == MODEL


def test_config_file_flags_are_read(tmp_path):
    cfg = tmp_path / "serve.yaml"
    cfg.write_text("max-num-seqs: 9\nenable-prefix-caching: false\nspeculative-config: {num_speculative_tokens: 2}\n")
    a = parse([MODEL, "--config", str(cfg), "--max-num-seqs", "11"])
    assert a.max_num_seqs == 11 and not a.enable_prefix_caching and a.num_speculative_tokens == 2
