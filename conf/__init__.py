"""Hydra configuration tree, installed as ``kvrl.conf``."""
