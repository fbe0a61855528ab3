"""Hooked capture of key/value statistics from Hugging Face models."""

from headwidget.capture.adapters import adapter_for, supported_families
from headwidget.capture.layout import AttentionLayout, RopeLayout
from headwidget.capture.session import capture, estimate

__all__ = ["AttentionLayout", "RopeLayout", "adapter_for", "capture", "estimate", "supported_families"]
