"""FlashServe: a Kubernetes operator for DeepSeek-V4.1-Flash on NVIDIA Blackwell."""

__version__ = "0.1.0"
