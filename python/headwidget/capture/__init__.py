"""Hooked capture of key/value statistics from Hugging Face models."""

from headwidget.adapters import adapter_for, supported_families
from headwidget.capture.session import capture, estimate
from headwidget.core.layout import AttentionLayout, RopeLayout

__all__ = ["AttentionLayout", "RopeLayout", "adapter_for", "capture", "estimate", "supported_families"]
