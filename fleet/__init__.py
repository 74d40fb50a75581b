"""Fleet: a Kubernetes-class container orchestrator in Python on Trio."""

__version__ = "0.1.0"
