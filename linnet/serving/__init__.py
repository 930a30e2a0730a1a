"""Serving: Triton Inference Server model repositories."""
