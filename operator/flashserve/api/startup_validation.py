"""The rules of spec.startup that relate several fields (validation.py calls them; crd.py states the same
rules in CEL). Each error names the field and the fix."""

from __future__ import annotations

from flashserve.api.v1alpha1 import DeepSeekServingSpec
from flashserve.facts.engine_choices import MULTITHREAD_LOAD_FORMATS


def startup_errors(spec: DeepSeekServingSpec) -> list[tuple[str, str]]:
    """(field path, message) for every broken rule of spec.startup."""
    st = spec.startup
    if st is None:
        return []
    errs: list[tuple[str, str]] = []
    src = spec.model.source
    wc = st.weights_cache
    if wc is not None and src.pvc is not None:
        errs.append(("spec.startup.weightsCache",
                     "the weights already come from a volume (spec.model.source.pvc), so there is nothing to cache: "
                     "remove weightsCache, or source the weights from huggingFace"))  # fmt: skip
    if wc is not None and src.hugging_face is not None and src.hugging_face.cache_pvc_name:
        errs.append(("spec.startup.weightsCache",
                     "spec.model.source.huggingFace.cachePvcName already names a Hugging Face cache: keep one of the "
                     "two (weightsCache adds the prefetch and the node-local scope)"))  # fmt: skip
    ld = st.loader
    multithread = " or ".join(MULTITHREAD_LOAD_FORMATS)
    if ld.threads is not None and ld.format not in MULTITHREAD_LOAD_FORMATS:
        errs.append(("spec.startup.loader.threads",
                     f"vLLM's multi-threaded load reads safetensors with format {multithread}, not {ld.format}: "
                     "unset threads or change the format"))  # fmt: skip
    if ld.safetensors_load_strategy is not None and ld.format not in MULTITHREAD_LOAD_FORMATS:
        errs.append(("spec.startup.loader.safetensorsLoadStrategy",
                     f"only vLLM's default safetensors loader (format {multithread}) reads it, not {ld.format}: "
                     "unset it or change the format"))  # fmt: skip
    if ld.threads is not None and ld.safetensors_load_strategy not in (None, "lazy"):
        errs.append(("spec.startup.loader.safetensorsLoadStrategy",
                     f"vLLM refuses the multi-threaded load with strategy {ld.safetensors_load_strategy} (its "
                     "multi-threaded loader only memory-maps): set it to lazy or unset threads"))  # fmt: skip
    if ld.runai_streamer is not None and ld.format != "runai_streamer":
        errs.append(("spec.startup.loader.runaiStreamer",
                     f"options of the Run:ai streamer, but the format is {ld.format}: set format: runai_streamer "
                     "or remove runaiStreamer"))  # fmt: skip
    return errs
