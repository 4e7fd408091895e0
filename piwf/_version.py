"""The package version, read by packaging and by ``piwf --version``."""

__version__ = "0.1.0"
