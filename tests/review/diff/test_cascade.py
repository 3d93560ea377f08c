"""Replacement cascades: what a replaced resource drags along in the reference plans."""

from __future__ import annotations

from dlinfra.review.diff.compare import compare
from tests.review.diff.conftest import STACK, reference_sets


def test_a_replaced_subnet_drags_what_holds_it_along() -> None:
    # Offline ids follow URNs, so without the cascade nothing that holds the subnet would change.
    result = compare(*reference_sets())
    by_name = {(c.stack, c.name): c for c in result.changes}
    assert by_name[(STACK, "network-private-us-west-2a")].action == "replace"
    # Held through a replacement-forcing input: replaced too, and said why.
    mount = by_name[(STACK, "storage-efs-us-west-2a")]
    assert (mount.action, mount.inputs) == ("replace", ("subnetId",))
    assert mount.note == "cascade: network-private-us-west-2a (prod-us-west-2) is replaced"
    lustre = by_name[(STACK, "storage-lustre")]
    assert lustre.action == "replace" and lustre.inputs == ("subnetIds",)
    assert lustre in result.dangerous  # stateful data lost: shown first
    # Held through an updatable input: an update whose new value is known only after apply.
    cluster = by_name[(STACK, "cluster-eks")]
    assert cluster.action == "update" and "vpcConfig" in cluster.inputs and "known after apply" in cluster.note
    # Transitive: the replaced file system's association follows it.
    assert by_name[(STACK, "storage-lustre-datasets")].note.startswith("cascade: storage-lustre (prod-us-west-2)")
    # Other regions and AZs are untouched.
    assert not [c for c in result.changes if c.stack == "prod-eu-west-1"]
    assert (STACK, "storage-efs-us-west-2b") not in by_name
