"""Code that runs in AWS Lambda, deployed by components (each module is one function's whole package)."""
