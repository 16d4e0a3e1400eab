"""Jinja2 templates shipped as package data (sbatch scripts, reports, config snippets)."""
