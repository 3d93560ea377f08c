# Layer 2 for the CPU node image; applied after common.pkrvars.hcl.
variant               = "cpu"
chef_role             = "cpu-node"
nvidia_driver_version = ""
