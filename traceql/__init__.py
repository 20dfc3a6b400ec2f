"""traceql: an offline analyzer for distributed PyTorch training runs."""

__version__ = "0.1.0"
