"""kvrl: KV-cache memory management research framework."""
__version__ = "0.1.0"
