"""Shared helpers of the vit-part3 scripts: one small module per concern."""
