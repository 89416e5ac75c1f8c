"""LUCID: individually differentially private label-only access via iDP verification."""

__version__ = "0.1.0"
