"""Spec -> Kubernetes objects: the renderer, the vLLM argument builder, placement and child names."""
