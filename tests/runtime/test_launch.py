"""What the runtime starts for a pod: command line, address (its loopback pod IP), port, profile and mock settings."""

from __future__ import annotations

import ipaddress

import pytest
from flashserve.render.vllm_args import START_RANK_SCRIPT
from flashserve_testbed.runtime.launch import (
    LaunchSettings,
    api_port,
    build_launch,
    choose_profile,
    duration_seconds,
    group_nodes,
    pod_address,
)

from tests.builders import node, pod_from_sample

SETTINGS = LaunchSettings(engine_bin="/opt/venv/bin", time_scale=4, startup_seconds=6, seed=3)


def test_the_address_is_the_loopback_pod_ip_itself():
    assert pod_address("127.4.3.7") == "127.4.3.7"


@pytest.mark.parametrize("ip", ["10.64.3.7", "172.16.0.2", "127.0.0.1", "fd00::5", "", None])
def test_a_pod_ip_outside_loopback_or_missing_is_refused_by_name(ip):
    with pytest.raises(ValueError, match="pod demo/x: status.podIP"):
        pod_address(ip, "pod demo/x")


def test_single_node_pod_runs_its_own_command_with_the_pod_address():
    pod = pod_from_sample("gb200-minimal.yaml")
    launch = build_launch(pod, node("NVIDIA-GB200"), SETTINGS)
    container = pod["spec"]["containers"][0]
    assert launch.argv == [*container["command"], *container["args"], "--host", "127.4.3.7"]
    assert launch.argv[:2] == ["vllm", "serve"]
    assert (launch.address, launch.port, launch.profile) == ("127.4.3.7", 8000, "gb200-4gpu")
    env = launch.env
    assert env["PATH"].split(":")[0] == "/opt/venv/bin"
    assert env["FLASHSERVE_MOCK_STARTUP_SECONDS"] == "6" and env["FLASHSERVE_MOCK_TIME_SCALE"] == "4"
    assert env["FLASHSERVE_MOCK_PROFILE"] == "gb200-4gpu"
    assert env["FLASHSERVE_MOCK_SEED"].isdigit()
    assert env["HF_HOME"] == "/var/cache/huggingface"  # the pod's own environment comes along


def test_multi_node_pod_keeps_the_wrapper_and_gets_the_multi_node_profile():
    pod = pod_from_sample("gb200-nvl72-wide-ep.yaml", index=1)
    launch = build_launch(pod, node("NVIDIA-GB200"), SETTINGS)
    assert launch.argv[:4] == ["/bin/sh", "-c", START_RANK_SCRIPT, "vllm"]
    assert launch.argv[-2:] == ["--host", "127.4.3.7"]  # inside "$@", before the script's start rank
    assert launch.env["FLASHSERVE_POD_INDEX"] == "1" and launch.env["FLASHSERVE_DP_LOCAL"] == "4"
    assert launch.profile == "gb200-nvl72-2node"


def test_b200_profile_and_seed_differs_per_pod():
    a = build_launch(pod_from_sample("b200-8gpu.yaml", 0), node("NVIDIA-B200"), SETTINGS)
    b = build_launch(pod_from_sample("b200-8gpu.yaml", 1, ip="127.4.3.8"), node("NVIDIA-B200"), SETTINGS)
    assert a.profile == "b200-8gpu"
    assert a.env["FLASHSERVE_MOCK_SEED"] != b.env["FLASHSERVE_MOCK_SEED"]


def test_annotation_and_pod_env_override_runtime_defaults():
    pod = pod_from_sample("gb200-minimal.yaml")
    pod["metadata"]["annotations"]["flashserve.io/startup-delay"] = "90s"
    pod["spec"]["containers"][0]["env"] += [{"name": "FLASHSERVE_MOCK_TIME_SCALE", "value": "2"},
                                            {"name": "FLASHSERVE_MOCK_PROFILE", "value": "gb200-4gpu-demo"}]
    launch = build_launch(pod, node("NVIDIA-GB200"), SETTINGS)
    assert launch.env["FLASHSERVE_MOCK_STARTUP_SECONDS"] == "90"
    assert launch.env["FLASHSERVE_MOCK_TIME_SCALE"] == "2"
    assert launch.profile == "gb200-4gpu-demo"
    no_delay = build_launch(pod_from_sample("gb200-minimal.yaml"), node("NVIDIA-GB200"),
                            LaunchSettings(engine_bin="/b"))
    assert "FLASHSERVE_MOCK_STARTUP_SECONDS" not in no_delay.env  # the runtime's cache model or the profile
    assert "PYTHONPATH" not in no_delay.env


def test_engines_get_the_runtimes_python_path_unless_the_pod_sets_its_own():
    settings = LaunchSettings(engine_bin="/b", python_path="/src/operator:/src/testbed")
    assert build_launch(pod_from_sample("gb200-minimal.yaml"), node("NVIDIA-GB200"),
                        settings).env["PYTHONPATH"] == "/src/operator:/src/testbed"
    pod = pod_from_sample("gb200-minimal.yaml")
    pod["spec"]["containers"][0]["env"].append({"name": "PYTHONPATH", "value": "/pod"})
    assert build_launch(pod, node("NVIDIA-GB200"), settings).env["PYTHONPATH"] == "/pod"


def test_ports_and_group_sizes():
    assert api_port(["vllm", "serve", "m", "--port=9000"], {}) == 9000
    assert api_port(["vllm", "serve", "m"], {"ports": [{"name": "http", "containerPort": 8080}]}) == 8080
    assert api_port(["vllm", "serve", "m"], {}) == 8000
    assert group_nodes(["-dp", "8", "--data-parallel-size-local", "4"]) == 2
    assert group_nodes(["--data_parallel_size=16", "-dpl", "4"]) == 4
    assert group_nodes(["--data-parallel-size", "4"]) == 1


def test_profile_choice():
    assert choose_profile("NVIDIA-GB200", 1) == "gb200-4gpu"
    assert choose_profile("NVIDIA-GB200", 2) == "gb200-nvl72-2node"
    assert choose_profile("NVIDIA-GB200", 4) == "gb200-nvl72-2node"
    assert choose_profile("NVIDIA-B200", 1) == "b200-8gpu"
    assert choose_profile("NVIDIA-H100", 1) == "gb200-4gpu"  # unknown hardware: the default profile
    assert choose_profile(None, 1) == "gb200-4gpu"


def test_a_forced_profile_applies_to_every_pod():
    forced = LaunchSettings(engine_bin="/b", profile="b200-8gpu")
    assert build_launch(pod_from_sample("gb200-minimal.yaml"), node("NVIDIA-GB200"), forced).profile == "b200-8gpu"


def test_durations():
    assert duration_seconds("90s") == 90 and duration_seconds("2m") == 120 and duration_seconds("1m30s") == 90
    assert duration_seconds("45") == 45 and duration_seconds("500ms") == 0.5
    with pytest.raises(ValueError):
        duration_seconds("soon")
