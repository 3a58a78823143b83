"""The flag table (operator/flashserve/facts/vllm_flags.json) against the real vLLM 0.33.0 parser: regenerating it
gives the checked-in file, and every spelling the extraArgs guard refuses does what the guard says to vLLM:
it sets the managed setting the guard names, or vLLM refuses it (ambiguous prefixes, values on switches)."""

from __future__ import annotations

import difflib
import json
from pathlib import Path

from flashserve.facts import vllm_flags
from flashserve.facts.managed import REFUSED_DESTS, extra_args_errors, managed_flag_of

from tests.builders import SUB_KEYS
from tests.contract.conftest import run_in_vllm

TABLE = Path(vllm_flags.__file__).with_name("vllm_flags.json")

# Where vLLM applies a refused spelling to other settings than the option's own, and why.
ELSEWHERE: dict[str, set[str]] = {
    "model": {"model_tag", "model"},  # `--model X` moves to the positional model (not `--model.x=1`)
    "help": set(),  # prints the help and exits
}


def test_table_is_what_the_real_parser_gives(vllm_python):
    fresh = run_in_vllm(vllm_python, "gen_flags.py", "--print")
    old = TABLE.read_text()
    diff = "".join(difflib.unified_diff(old.splitlines(True), fresh.splitlines(True), "vllm_flags.json",
                                        "vllm serve parser", n=1))  # fmt: skip
    assert not diff, f"vllm_flags.json drifted from vLLM's parser (run tools/vllm-contract/harness/gen_flags.py):\n{diff[:6000]}"


def test_refused_spellings_set_the_managed_setting_in_real_vllm(vllm_python, tmp_path):
    config = tmp_path / "serve.yaml"
    config.write_text("port: 8123\n")
    cases = []
    for option in vllm_flags.OPTIONS:
        for s in vllm_flags.spellings(option, SUB_KEYS.get(option.dest)):
            refused = bool(extra_args_errors(list(s.argv)))
            if option.dest not in REFUSED_DESTS and not (s.form == "flag" and s.vllm == "sets"):
                continue  # unmanaged options: their plain spellings, to hold the table to the parser
            argv = [str(config) if (option.dest == "config" and a == "x") else a for a in s.argv]
            argv = [a.replace("=x", f"={config}") if option.dest == "config" else a for a in argv]
            cases.append({"argv": argv, "model": option.dest != "model", "dest": option.dest, "vllm": s.vllm,
                          "refused": refused, "names": managed_flag_of(s.argv[0])})  # fmt: skip
    out = json.loads(run_in_vllm(vllm_python, "parse_argv.py", input=json.dumps(cases), timeout=600))
    assert len(out) == len(cases)
    wrong = []
    for case, got in zip(cases, out):
        dest = case["dest"]
        want = ELSEWHERE.get(dest, {dest})
        if dest == "config" and case["argv"][0] == "--config":
            want = {"port"}  # the exact `--config FILE` item splices the file's keys in
        if case["vllm"] == "sets" and want:
            ok = bool(want & set(got.get("sets", ())))
        else:
            ok = "error" in got
        if not ok:
            wrong.append((case["argv"], case["vllm"], got))
    assert wrong == [], f"{len(wrong)} spellings do not do in vLLM what the table says, e.g. {wrong[:10]}"
    refused = [c for c in cases if c["dest"] in REFUSED_DESTS]
    assert refused and all(c["refused"] for c in refused)
    # not over-broad: the guard named the very setting vLLM applied, wherever vLLM applied one
    named = [(c["argv"], c["names"]) for c, g in zip(cases, out)
             if c["dest"] in REFUSED_DESTS and c["dest"] not in ELSEWHERE and "sets" in g
             and c["names"] not in g["sets"] and not (c["dest"] == "config" and c["argv"][0] == "--config")]  # fmt: skip
    assert named == []
