"""Job operators a lab may install beside dlinfra, whose job kinds Kueue can then queue: facts, with their sources.

dlinfra installs none of them. Each one's controller creates the pods (or the child jobs) of its job kinds, and the
admission policies of components/charts/gpu_admission.py trust those only from the service accounts of namespaces
the fleet names (`environments.<env>.kubernetes.job_operators`: operator -> namespace). So Kueue is told to manage
a kind only when its operator is named there: a kind whose operator is not trusted would have every GPU pod refused,
and one that Kueue does not know is just a custom object to it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

BATCH_JOB = "batch/job"  # Kubernetes' own Jobs: kube-controller-manager makes their pods; always queued


@dataclass(frozen=True)
class JobOperator:
    frameworks: tuple[str, ...]  # the Kueue integrations of its kinds (Kueue v0.19.2 Integrations.Frameworks names)
    requires: tuple[str, ...]  # operators whose kinds it creates, which must be named too
    source: str  # where its kinds and installation are documented


OPERATORS: Mapping[str, JobOperator] = {
    # JobSet: a JobSet's controller creates batch Jobs owned by it (JobSet docs, "Overview", "Installation": its
    # manifests install into jobset-system); Kueue docs "Run A JobSet".
    "jobset": JobOperator(
        ("jobset.x-k8s.io/jobset",), (), "jobset.sigs.k8s.io docs, Installation; Kueue docs Run A JobSet"
    ),
    # Kubeflow Trainer v2: a TrainJob becomes a JobSet (Trainer docs "Installation": Helm into kubeflow-system, with
    # a JobSet controller beside it, so name jobset too); Kueue docs "Run A TrainJob".
    "kubeflow-trainer": JobOperator(
        ("trainer.kubeflow.org/trainjob",),
        ("jobset",),
        "kubeflow.org Trainer docs, Installation; Kueue docs Run A TrainJob",
    ),
    # Kubeflow Training Operator v1 (legacy): its controller creates a PyTorchJob's pods; Kueue docs "Run a Kubeflow
    # PyTorchJob".
    "kubeflow-training-operator": JobOperator(
        ("kubeflow.org/pytorchjob",), (), "kubeflow.org Training Operator docs; Kueue docs Run a PyTorchJob"
    ),
    # MPI Operator v2 (kubeflow.org/v2beta1 MPIJob): workers are pods of the MPIJob, the launcher a batch Job it owns;
    # Kueue docs "Run An MPIJob".
    "mpi-operator": JobOperator(
        ("kubeflow.org/mpijob",), (), "github.com/kubeflow/mpi-operator; Kueue docs Run An MPIJob"
    ),
    # KubeRay: the operator creates a RayCluster's pods, and a RayJob's RayCluster; Kueue docs "Run A RayJob",
    # "Run A RayCluster".
    "kuberay": JobOperator(
        ("ray.io/rayjob", "ray.io/raycluster"), (), "docs.ray.io KubeRay; Kueue docs Run A RayJob, Run A RayCluster"
    ),
}


def frameworks(operators: Mapping[str, str]) -> tuple[str, ...]:
    """The job kinds Kueue manages with these operators (name -> namespace) installed: batch Jobs, then each named
    operator's kinds in table order (so the order in the fleet file changes nothing)."""
    unknown = sorted(set(operators) - set(OPERATORS))
    if unknown:
        raise ValueError(f"job_operators: unknown {', '.join(unknown)}; known: {', '.join(OPERATORS)}")
    return (BATCH_JOB, *(f for name, op in OPERATORS.items() if name in operators for f in op.frameworks))


def all_frameworks() -> tuple[str, ...]:
    """Every job kind any known operator brings, batch Jobs first."""
    return frameworks(dict.fromkeys(OPERATORS, ""))
