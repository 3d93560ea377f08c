"""dlinfra: infrastructure as code for deep-learning research on AWS and physical GPU sites."""

__version__ = "0.1.0"
