"""What the vit-part3 scripts run on (docs/layout.md)."""
