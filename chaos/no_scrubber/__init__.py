"""A PYTHONPATH entry: see sitecustomize.py."""
