"""Runs inside the aiperf venv (tools/aiperf/install.sh): loads each trace file given with aiperf's own Mooncake
trace loader and prints, per file, its sessions as aiperf groups them: {session_id: [turn, ...]} with the
fields aiperf keeps. The loader's prompt generator is not needed to group and time the turns; a stand-in
carries the three attributes its set-up touches."""

import json
import sys
from types import SimpleNamespace

from aiperf.dataset.loader.mooncake_trace import MooncakeTraceDatasetLoader


def stand_in_prompt_generator() -> SimpleNamespace:
    return SimpleNamespace(tokenizer=SimpleNamespace(resolved_name="none"),
                           _hash_id_corpus_rng=SimpleNamespace(set_trace_id=lambda _id: None), _cache={})


def main(paths: list[str]) -> None:
    out = {}
    for path in paths:
        loader = MooncakeTraceDatasetLoader(filename=path, prompt_generator=stand_in_prompt_generator())
        data = loader.load_dataset()
        out[path] = {sid: [t.model_dump(include={"input_length", "output_length", "hash_ids", "timestamp", "delay"})
                           for t in turns] for sid, turns in data.items()}
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1:])
